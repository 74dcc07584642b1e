"""Which instances take which share of each endpoint, computed from the database, published whole.

The routing table is never patched: every publication is computed afresh from the deployments'
``traffic`` and their ready instances, for every live deployment at once, under one Redis lock.
So a worker killed between two publications leaves a table the next one simply replaces, and
two controllers publishing at once cannot leave a stale one behind.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings

from portal.core.redis_clients import redis_client
from portal.deployments.launchers import get_launcher, version_set
from portal.deployments.launchers.base import Health, ObservedInstance, Route, TrafficShare
from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    Instance,
    InstanceState,
    Strategy,
)

PUBLISH_LOCK_SECONDS = 30
#: The digest and generation of the last table published.
PUBLISHED_KEY = "routing:published"


def route_path(deployment: Deployment) -> str:
    """The endpoint's path under the gateway: per model (Red-Black) or per version (Versioned)."""
    model = deployment.model
    path = f"{model.team.slug}/{model.slug}"
    if deployment.strategy == Strategy.VERSIONED:
        path += f"/versions/{deployment.target_version.number}"
    return path


def endpoint_url(deployment: Deployment) -> str:
    """The OpenAI base URL callers use (the local gateway's; a cluster's gateway maps the same
    paths)."""
    return f"{settings.GATEWAY_URL}/models/{route_path(deployment)}/v1"


def kserve_url(deployment: Deployment) -> str:
    """The KServe v2 HTTP base URL through the gateway: the gateway passes ``<base>/v2/...`` to
    the instances' KServe HTTP servers, whatever the model's backend (tritonclient.http takes it
    without the scheme as its ``url``)."""
    return f"{settings.GATEWAY_URL}/models/{route_path(deployment)}"


def serves_openai(deployment: Deployment) -> bool:
    """Whether the serving version answers OpenAI routes: only the ``openai+grpc`` surface
    does; a ``grpc`` version (every Python-backend one) serves KServe v2 alone."""
    return deployment.target_version.api_surface == "openai+grpc"


@dataclass(frozen=True)
class CallEndpoints:
    """Where callers reach a deployment. ``openai`` is None for a KServe-only version. gRPC is
    not proxied by the gateway, so ``kserve_grpc`` lists the ready instances' own addresses
    (they change as instances are replaced: fine for trying a model, not for callers that must
    ride through a rollout; those use ``kserve_http``)."""

    openai: str | None
    kserve_http: str
    kserve_grpc: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def call_endpoints(deployment: Deployment) -> CallEndpoints:
    ready = deployment.instances.filter(state=InstanceState.READY).order_by("id")
    return CallEndpoints(
        openai=endpoint_url(deployment) if serves_openai(deployment) else None,
        kserve_http=kserve_url(deployment),
        kserve_grpc=[i.endpoints["kserve_grpc"] for i in ready if "kserve_grpc" in i.endpoints],
    )


def routes() -> list[Route]:
    deployments = Deployment.objects.filter(observed_state__in=LIVE_STATES).select_related(
        "model__team", "target_version", "instance_type"
    )
    table = []
    for deployment in deployments:
        if not deployment.traffic:
            continue
        ready = Instance.objects.filter(
            deployment=deployment, state=InstanceState.READY
        ).select_related("version__release", "version__model__team")
        shares = []
        for number, weight in sorted(deployment.traffic.items()):
            members = [i for i in ready if i.version.number == int(number)]
            version = (
                members[0].version
                if members
                else deployment.model.versions.select_related("release").get(number=int(number))
            )
            shares.append(
                TrafficShare(
                    version_set=version_set(deployment, version),
                    weight=int(weight),
                    instances=tuple(
                        ObservedInstance(i.name, Health.READY, dict(i.endpoints)) for i in members
                    ),
                )
            )
        table.append(Route(deployment.pk, route_path(deployment), tuple(shares)))
    return table


def publish() -> int:
    """Publish the whole routing table; returns its generation for ``traffic_applied``.

    A table equal to the last one published is not published again: its generation stands,
    so waiting for it to be applied is not reset by every controller step."""
    client = redis_client(decode_responses=True)
    with client.lock("routing:publish", timeout=PUBLISH_LOCK_SECONDS, blocking_timeout=10):
        table = routes()
        digest = hashlib.sha256(_canonical(table).encode()).hexdigest()
        last = client.hgetall(PUBLISHED_KEY)
        if last.get("digest") == digest:
            return int(last["generation"])
        generation = get_launcher().set_traffic(table)
        client.hset(PUBLISHED_KEY, mapping={"digest": digest, "generation": generation})
        return generation


def _canonical(table: list[Route]) -> str:
    return json.dumps(
        [
            [
                route.path,
                [
                    [
                        share.version_set.key,
                        share.weight,
                        [[i.name, i.endpoints] for i in share.instances],
                    ]
                    for share in route.shares
                ],
            ]
            for route in table
        ],
        sort_keys=True,
    )
