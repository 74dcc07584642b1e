"""Print the platform gateway's Kubernetes objects as YAML, for ``kubectl apply -f -``."""

from __future__ import annotations

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from portal.deployments.models import Region
from portal.deployments.runtime.launchers.k8s_objects import gateway_objects


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
        parser.add_argument(
            "--region",
            help="the region whose gateways these are: they follow its routing table (its "
            "gateway prefix) and run in its namespace unless --namespace is given; apply them "
            "to that region's cluster (kubectl --context)",
        )

    def handle(
        self, *args, image, replicas, namespace, redis_secret, drain_seconds, region, **options
    ):
        if replicas < 2:
            raise CommandError(
                "--replicas must be at least 2: one pod is a single point of failure."
            )
        prefix = settings.GATEWAY_REDIS_PREFIX
        if region is not None:
            found = Region.objects.filter(name=region).first()
            if found is None:
                names = ", ".join(Region.objects.values_list("name", flat=True))
                raise CommandError(f"No region {region!r}; the regions are: {names}.")
            prefix = found.gateway_prefix
            if namespace == settings.KUBERNETES_NAMESPACE and found.kubernetes_namespace:
                namespace = found.kubernetes_namespace
        objects = gateway_objects(
            namespace=namespace,
            image=image,
            replicas=replicas,
            redis_secret=redis_secret,
            redis_prefix=prefix,
            drain_seconds=drain_seconds,
        )
        self.stdout.write(yaml.safe_dump_all(objects, sort_keys=False), ending="")
