"""Print the platform gateway's Kubernetes objects as YAML, for ``kubectl apply -f -``."""

from __future__ import annotations

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from portal.deployments.launchers.k8s_objects import gateway_objects


class Command(BaseCommand):
    help = (
        "Print the Deployment, Service and PodDisruptionBudget of the platform's gateway on "
        "Kubernetes (the request path that checks caller keys and rate limits)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--image",
            default="llm-serving-platform-portal:latest",
            help="the portal image (docker/Dockerfile), which carries the gateway",
        )
        parser.add_argument("--replicas", type=int, default=2)
        parser.add_argument("--namespace", default=settings.KUBERNETES_NAMESPACE)
        parser.add_argument(
            "--redis-secret",
            default="llm-serving-redis",
            help="a Secret whose key 'url' is the platform's REDIS_URL",
        )
        parser.add_argument("--drain-seconds", type=int, default=30)

    def handle(self, *args, image, replicas, namespace, redis_secret, drain_seconds, **options):
        if replicas < 2:
            raise CommandError(
                "--replicas must be at least 2: one pod is a single point of failure."
            )
        objects = gateway_objects(
            namespace=namespace,
            image=image,
            replicas=replicas,
            redis_secret=redis_secret,
            redis_prefix=settings.GATEWAY_REDIS_PREFIX,
            drain_seconds=drain_seconds,
        )
        self.stdout.write(yaml.safe_dump_all(objects, sort_keys=False), ending="")
