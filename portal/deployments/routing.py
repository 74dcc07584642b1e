"""Which instances take which share of each endpoint, computed from the database, published whole.

The routing table is never patched: every publication is computed afresh from the deployments'
``traffic`` and their ready instances, for every live deployment at once, under one Redis lock,
and handed whole to the launcher (:meth:`Launcher.set_traffic`, which the gateways read as one
document). So a worker killed between two publications leaves a table the next one simply
replaces, and two controllers publishing at once cannot leave a stale one behind.

What scales with the number of deployments is kept out of the common step. Every reconcile asks
:func:`publish` for *its own* deployment: it computes that one route from the deployment and
instance rows the step holds (no query; :func:`route_of`) and compares its digest with the one
recorded for it in Redis when the last table was published. Only when they differ (its traffic or
its ready instances changed, or it left or joined the live set) is the whole table built again from
the database, in a fixed number of queries too (deployments, their ready instances, the versions a
split names that have none), and published. The comparison is with what was published, not with
what the step did, so a change that a worker killed before publishing left behind is published by
the deployment's next step. A serving deployment whose instances stay as they are therefore never
pays for the others; a step that changes routing pays one build of the table, and one published by
a concurrent worker after the change is reused rather than repeated. This was chosen over patching
the table per route because the launcher interface and the gateway's table stay whole documents (a
Kubernetes launcher syncs every Service and HTTPRoute from it, and the gateway swaps its table
whole), so the crash-safety argument above does not change.

An instance is stopped only once a table without it is applied (:func:`.instances.stop_drained`).
:func:`publish` answers for a deployment with the generation of the first table in which its
route was what it is now (or, with no route, the latest table); every later table carries the
same route, so waiting for that generation is enough, and no more than needed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, cast

from django.conf import settings
from django.db.models import QuerySet

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
from portal.registry.models import ModelVersion

PUBLISH_LOCK_SECONDS = 30
#: The digest and generation of the last table published.
PUBLISHED_KEY = "routing:published"
#: Marks a ``PUBLISHED_KEY`` that records each route's digest (``route:<deployment id>`` →
#: ``<generation since>:<digest>``) beside the table's; anything else is published again.
FORMAT = "routes-v1"


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
    """The whole table: every live deployment's route."""
    return _routes(Deployment.objects.filter(observed_state__in=LIVE_STATES))


def route_of(deployment: Deployment, rows: Iterable[Instance] | None = None) -> Route | None:
    """The deployment's route as the table lists it; None when it has none (not live, or no
    traffic yet). Read from the database, or, given ``rows``, from the deployment and its
    instance rows as the caller holds them (the controller's step keeps both current), which
    costs no query at all when the split names only its target and previous versions."""
    if rows is None:
        found = _routes(Deployment.objects.filter(pk=deployment.pk, observed_state__in=LIVE_STATES))
        return found[0] if found else None
    if deployment.observed_state not in LIVE_STATES or not deployment.traffic:
        return None
    ready: dict[int, list[Instance]] = {}
    for row in sorted(rows, key=lambda r: r.pk):
        if row.state == InstanceState.READY:
            ready.setdefault(row.version.number, []).append(row)
    versions = {v.number: v for v in (deployment.target_version, deployment.previous_version) if v}
    if any(n not in ready and n not in versions for n in deployment.traffic):
        return route_of(deployment)
    return _route(deployment, ready, versions)


def _routes(deployments: QuerySet[Deployment]) -> list[Route]:
    """The routes of ``deployments`` in at most three queries however many there are: the
    deployments, their ready instances, and the versions a traffic split names that have no
    ready instance (a share waiting for its instances still names its version)."""
    live = [
        d
        for d in deployments.select_related(
            "model__team", "target_version", "instance_type"
        ).order_by("pk")
        if d.traffic
    ]
    ready: dict[int, dict[int, list[Instance]]] = {}
    for instance in (
        Instance.objects.filter(deployment__in=deployments.values("pk"), state=InstanceState.READY)
        .select_related("version__release", "version__model__team")
        .order_by("pk")
    ):
        of = ready.setdefault(instance.deployment_id, {})
        of.setdefault(instance.version.number, []).append(instance)
    wanted = {
        (d.model_id, number)
        for d in live
        for number in d.traffic
        if number not in ready.get(d.pk, {})
    }
    versions: dict[int, dict[int, ModelVersion]] = {}
    if wanted:
        candidates = ModelVersion.objects.filter(
            model_id__in={m for m, _ in wanted}, number__in={n for _, n in wanted}
        ).select_related("release", "model__team")
        for version in candidates:
            versions.setdefault(version.model_id, {})[version.number] = version
    return [
        _route(deployment, ready.get(deployment.pk, {}), versions.get(deployment.model_id, {}))
        for deployment in live
    ]


def _route(
    deployment: Deployment,
    ready: dict[int, list[Instance]],
    versions: dict[int, ModelVersion],
) -> Route:
    """One route: per version of the split (in the order of its number), the weight over that
    version's ready instances in the order of their ids."""
    shares = []
    for number, weight in sorted(deployment.traffic.items()):
        members = ready.get(number, [])
        version = members[0].version if members else versions[number]
        shares.append(
            TrafficShare(
                version_set=version_set(deployment, version),
                weight=weight,
                instances=tuple(
                    ObservedInstance(i.name, Health.READY, dict(i.endpoints)) for i in members
                ),
            )
        )
    return Route(deployment.pk, route_path(deployment), tuple(shares))


def publish(deployment: Deployment | None = None, rows: Iterable[Instance] | None = None) -> int:
    """Bring the published table up to date with ``deployment``'s route (with every route when
    None) and return a generation for ``traffic_applied``: for a deployment, that of the first
    published table in which its route was what it is now. ``rows``: see :func:`route_of`.

    The whole table is built from the database and published only when the deployment's route
    differs from what was last published for it; a table equal to the last one published is not
    published again (its generation stands, so waiting for it is not reset by every step)."""
    client = redis_client(decode_responses=True)
    mine = None
    if deployment is not None:
        mine = _digest(route_of(deployment, rows))
        known = _published_for(client, deployment.pk, mine)
        if known is not None:
            return known
    with client.lock("routing:publish", timeout=PUBLISH_LOCK_SECONDS, blocking_timeout=10):
        if deployment is not None:
            # A worker that held the lock meanwhile may have published this very route.
            known = _published_for(client, deployment.pk, mine)
            if known is not None:
                return known
        table = routes()
        digests = {route.deployment_id: _digest(route) for route in table}
        digest = hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()
        last = cast(dict[str, str], client.hgetall(PUBLISHED_KEY))  # decoded responses
        record: dict[str, str] = last
        if last.get("digest") != digest or last.get("format") != FORMAT:
            generation = get_launcher().set_traffic(table)
            record = {
                "format": FORMAT,
                "digest": digest,
                "generation": str(generation),
            }
            for pk, route_digest in digests.items():
                # A route unchanged since the last table keeps the generation it had there.
                before = last.get(f"route:{pk}", "") if last.get("format") == FORMAT else ""
                since = (
                    before.partition(":")[0] if before.endswith(f":{route_digest}") else generation
                )
                record[f"route:{pk}"] = f"{since}:{route_digest}"
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(PUBLISHED_KEY)
                pipe.hset(PUBLISHED_KEY, mapping=cast(dict[Any, Any], record))
                pipe.execute()
    mine_now = record.get(f"route:{deployment.pk}") if deployment is not None else None
    return int((mine_now or record["generation"]).partition(":")[0])


def _published_for(client: Any, deployment_id: int, digest: str | None) -> int | None:
    """The generation to wait for if the last published table has the deployment's route
    with ``digest`` (or, for None, has no route for it); None when it does not."""
    generation, recorded, fmt = client.hmget(
        PUBLISHED_KEY, ["generation", f"route:{deployment_id}", "format"]
    )
    if generation is None or fmt != FORMAT:
        return None  # nothing published yet that this module recorded: publish
    if digest is None:
        return int(generation) if recorded is None else None
    if recorded is not None:
        since, _, published = recorded.partition(":")
        if published == digest:
            return int(since)
    return None


def _digest(route: Route | None) -> str | None:
    """What identifies a route's published form: its path, and per share the version set, the
    weight and the instances with their endpoints."""
    if route is None:
        return None
    canonical = json.dumps(
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
        ],
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
