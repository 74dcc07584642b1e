"""Which instances take which share of each endpoint: the database is the truth, the table is
published whole.

The launcher always receives the whole table (:meth:`Launcher.set_traffic`, which the gateways
read as one document, and from which a Kubernetes launcher syncs every Service and HTTPRoute),
published under one Redis lock. So a worker killed between two publications leaves a table the
next one simply replaces, and two controllers publishing at once cannot leave a stale one behind.

What scales with the number of deployments is kept out of every step. Every reconcile asks
:func:`publish` for *its own* deployment: it computes that one route from the deployment and
instance rows the step holds (no query; :func:`route_of`) and compares its digest with the one
recorded for it in Redis when the last table was published. Only when they differ (its traffic,
its ready instances or anything else its route holds changed, or it left or joined the live set)
is a table published: the routes recorded with the last one, with this deployment's replaced (or
dropped), so a step that changes routing reads no other deployment from the database. Each route
is kept whole in Redis by its digest (``ROUTES_KEY``, written in the same transaction as the
record), and a worker keeps those it decoded: a digest names a route's whole content.

Taking the others' routes from the record rather than the database loses no change: a change
stored in the database whose step died before publishing is published by that deployment's next
step, which compares its route read from the database with the recorded digest; a deployment
that leaves the live set drops its recorded route the same way (its route is None and the record
has one). :func:`publish` with no deployment, and a record missing, incomplete or of another
``FORMAT``, build the whole table from the database instead (three queries, but every live
deployment made into model instances); beat's ``publish_routes`` does so every minute, the
backstop for a route whose deployment is no longer stepped.

Each region has its own table (its gateways follow their own Redis prefix): a deployment's
route is published in its region's table, under that region's record (:func:`_keys`).

An instance is stopped only once a table without it is applied (:func:`.instances.stop_drained`).
:func:`publish` answers for a deployment with the generation of the first table in which its
route was what it is now (or, with no route, the latest table); every later table carries the
same route, so waiting for that generation is enough, and no more than needed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from django.conf import settings
from django.db.models import QuerySet

from portal.core.redis_clients import redis_client
from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    Instance,
    InstanceState,
    Region,
    Strategy,
    default_region,
)
from portal.deployments.runtime.launchers import get_launcher, version_set
from portal.deployments.runtime.launchers.base import (
    Health,
    ObservedInstance,
    Route,
    Shape,
    TrafficShare,
    VersionSet,
)
from portal.registry.models import ModelVersion

PUBLISH_LOCK_SECONDS = 30
#: The digest and generation of the last table published.
PUBLISHED_KEY = "routing:published"
#: Marks a ``PUBLISHED_KEY`` that records each route's digest (``route:<deployment id>`` →
#: ``<generation since>:<digest>``) beside the table's, and whose routes ``ROUTES_KEY`` holds; a
#: record of any other format is replaced by one built from the database.
FORMAT = "routes-v2"
#: The routes of the last table published, by digest (digest → :func:`_dump`), written in the
#: same transaction as ``PUBLISHED_KEY``.
ROUTES_KEY = "routing:routes"
#: Routes this process has decoded, by digest: a digest names a route's whole content, so a
#: route decoded once serves every later table that still holds it.
_decoded: dict[str, Route] = {}
DECODED_MAX = 5_000  # about 3 kB each
log = logging.getLogger(__name__)


def route_path(deployment: Deployment) -> str:
    """The endpoint's path under the gateway: per model (Red-Black) or per version (Versioned)."""
    model = deployment.model
    path = f"{model.team.slug}/{model.slug}"
    if deployment.strategy == Strategy.VERSIONED:
        path += f"/versions/{deployment.target_version.number}"
    return path


def endpoint_url(deployment: Deployment) -> str:
    """The deployment's one base URL, at its region's gateways (a cluster's gateway maps the
    same paths): the OpenAI client's ``base_url`` (the gateway takes ``chat/completions`` and the
    other OpenAI routes right under it) and tritonclient's ``url`` (it adds ``v2/...``). A
    Versioned deployment's says its version: ``…/versions/2``. The form with ``/v1`` at the end,
    shown before, still works."""
    return f"{deployment.region.public_gateway_url}/models/{route_path(deployment)}"


def kserve_url(deployment: Deployment) -> str:
    """The KServe v2 HTTP base URL through the gateway: the same base URL, under which the
    gateway passes ``v2/...`` to the instances' KServe HTTP servers, whatever the model's
    backend (tritonclient.http takes it without the scheme as its ``url``)."""
    return endpoint_url(deployment)


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


@dataclass(frozen=True)
class _Keys:
    """Where one region's publication record, routes and lock live in Redis."""

    published: str
    routes: str
    lock: str


def _keys(region: Region) -> _Keys:
    """The region's keys: those of the platform's own gateway prefix keep the names they had
    before there were regions (the default region's table is where it always was)."""
    prefix = region.gateway_prefix
    if prefix == settings.GATEWAY_REDIS_PREFIX:
        return _Keys(PUBLISHED_KEY, ROUTES_KEY, "routing:publish")
    return _Keys(
        f"routing:{prefix}:published", f"routing:{prefix}:routes", f"routing:{prefix}:publish"
    )


def routes(region: Region | None = None) -> list[Route]:
    """The region's whole table (None: the default region's): its every live deployment's
    route."""
    region = region or default_region()
    return _routes(Deployment.objects.filter(region=region, observed_state__in=LIVE_STATES))


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
    return Route(
        deployment.pk,
        route_path(deployment),
        tuple(shares),
        wake=deployment.scale_to_zero_after_seconds is not None,
    )


def publish(deployment: Deployment | None = None, rows: Iterable[Instance] | None = None) -> int:
    """Bring the published table of ``deployment``'s region up to date with its route (with no
    deployment: every region's table with every route, returning the default region's
    generation) and return a generation for ``traffic_applied``: for a deployment, that of the
    first published table in which its route was what it is now. ``rows``: see
    :func:`route_of`.

    A table is published only when the deployment's route differs from what was last published
    for it: the recorded routes with its own replaced, not a table built from the database (see
    the module's docstring). A table equal to the last one published is not published again (its
    generation stands, so waiting for it is not reset by every step)."""
    if deployment is not None:
        return _publish(deployment.region, deployment, rows)
    generation = 0
    for region in Region.objects.all():
        try:
            published = _publish(region, None, None)
        except Exception:  # one region's cluster down must not keep the others' tables stale
            log.exception("publishing the routing table of region %s failed", region.name)
            continue
        if region.gateway_prefix == settings.GATEWAY_REDIS_PREFIX:
            generation = published
    return generation


def _publish(region: Region, deployment: Deployment | None, rows: Iterable[Instance] | None) -> int:
    """:func:`publish` in one region."""
    keys = _keys(region)
    client = redis_client(decode_responses=True)
    mine: Route | None = None
    mine_dumped: str | None = None
    if deployment is not None:
        mine = route_of(deployment, rows)
        mine_dumped = _dump(mine)
        fmt, latest, recorded = cast(
            list[str | None],  # decoded responses
            client.hmget(keys.published, ["format", "generation", f"route:{deployment.pk}"]),
        )
        known = _published_for(fmt, latest, recorded, _digest(mine_dumped))
        if known is not None:
            return known
    with client.lock(keys.lock, timeout=PUBLISH_LOCK_SECONDS, blocking_timeout=10):
        last = cast(dict[str, str], client.hgetall(keys.published))  # decoded responses
        current = last.get("format") == FORMAT
        if deployment is not None:
            # A worker that held the lock meanwhile may have published this very route.
            known = _published_for(
                last.get("format"),
                last.get("generation"),
                last.get(f"route:{deployment.pk}"),
                _digest(mine_dumped),
            )
            if known is not None:
                return known
        listed = (
            _recorded(client, keys.routes, last, deployment.pk)
            if deployment is not None and current
            else None
        )
        texts: dict[str, str] = {}  # the routes ROUTES_KEY lacks, by digest
        rebuilt = deployment is None or listed is None
        if deployment is not None and listed is not None:
            if mine is not None and mine_dumped is not None:
                mine_digest = cast(str, _digest(mine_dumped))
                listed[deployment.pk] = (mine_digest, mine)
                texts[mine_digest] = mine_dumped
        else:
            listed = {}
            for route in routes(region):
                text = cast(str, _dump(route))
                route_digest = cast(str, _digest(text))
                listed[route.deployment_id] = (route_digest, route)
                texts[route_digest] = text
        table = [listed[pk][1] for pk in sorted(listed)]
        digests = {pk: route_digest for pk, (route_digest, _) in listed.items()}
        digest = hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()
        record: dict[str, str] = last
        changed = last.get("digest") != digest or not current
        if changed:
            generation = get_launcher(region).set_traffic(table)
            record = {
                "format": FORMAT,
                "digest": digest,
                "generation": str(generation),
            }
            for pk, route_digest in digests.items():
                # A route unchanged since the last table keeps the generation it had there.
                before = last.get(f"route:{pk}", "") if current else ""
                since = (
                    before.partition(":")[0] if before.endswith(f":{route_digest}") else generation
                )
                record[f"route:{pk}"] = f"{since}:{route_digest}"
        if changed or rebuilt:
            with client.pipeline(transaction=True) as pipe:
                if changed:
                    pipe.delete(keys.published)
                    pipe.hset(keys.published, mapping=cast(dict[Any, Any], record))
                if rebuilt:  # ROUTES_KEY whole, whatever it held
                    pipe.delete(keys.routes)
                else:
                    gone = _route_digests(last) - set(digests.values())
                    if gone:
                        pipe.hdel(keys.routes, *gone)
                if texts:
                    pipe.hset(keys.routes, mapping=cast(dict[Any, Any], texts))
                pipe.execute()
        for route_digest, route in listed.values():
            _decoded.setdefault(route_digest, route)
    mine_now = record.get(f"route:{deployment.pk}") if deployment is not None else None
    return int((mine_now or record["generation"]).partition(":")[0])


def _published_for(
    fmt: str | None, generation: str | None, recorded: str | None, digest: str | None
) -> int | None:
    """The generation to wait for if the last published table (its record's ``format``,
    ``generation`` and the deployment's ``route:`` field) has the deployment's route with
    ``digest`` (or, for None, has no route for it); None when it does not."""
    if generation is None or fmt != FORMAT:
        return None  # nothing published yet that this module recorded: publish
    if digest is None:
        return int(generation) if recorded is None else None
    if recorded is not None:
        since, _, published = recorded.partition(":")
        if published == digest:
            return int(since)
    return None


def _recorded(
    client: Any, routes_key: str, last: dict[str, str], deployment_id: int
) -> dict[int, tuple[str, Route]] | None:
    """The routes of the table ``last`` records but the deployment's, by deployment id, each
    with its digest; None when ROUTES_KEY lacks one (then the table is built from the
    database, and ROUTES_KEY written again whole)."""
    listed = {
        int(key[6:]): value.partition(":")[2]
        for key, value in last.items()
        if key.startswith("route:")
    }
    listed.pop(deployment_id, None)
    if len(_decoded) > DECODED_MAX:
        _decoded.clear()
    known = {d: _decoded[d] for d in listed.values() if d in _decoded}
    missing = sorted(set(listed.values()) - set(known))
    if missing:
        for route_digest, text in zip(missing, client.hmget(routes_key, missing), strict=True):
            if text is None:
                return None
            known[route_digest] = _load(text)
    return {pk: (route_digest, known[route_digest]) for pk, route_digest in listed.items()}


def _route_digests(record: dict[str, str]) -> set[str]:
    return {v.partition(":")[2] for k, v in record.items() if k.startswith("route:")}


def _dump(route: Route | None) -> str | None:
    """A route as ROUTES_KEY keeps it, every field of it: what its digest covers, so that a
    route that differs in anything from the one recorded is published, and :func:`_load` gives
    back a route equal to the one built from the database. (``dataclasses.asdict`` measured
    20 times slower, and every step dumps its route.)"""
    if route is None:
        return None
    return json.dumps(
        {
            "deployment_id": route.deployment_id,
            "path": route.path,
            "wake": route.wake,
            "shares": [
                {
                    "version_set": {
                        **vars(share.version_set),
                        "package_path": str(share.version_set.package_path),
                        "weights_dir": str(share.version_set.weights_dir),
                        "shape": vars(share.version_set.shape),
                    },
                    "weight": share.weight,
                    "instances": [vars(instance) for instance in share.instances],
                }
                for share in route.shares
            ],
        },
        sort_keys=True,
    )


def _load(text: str) -> Route:
    data = json.loads(text)
    return Route(
        deployment_id=data["deployment_id"],
        path=data["path"],
        wake=data.get("wake", False),
        shares=tuple(
            TrafficShare(
                version_set=VersionSet(
                    **{
                        **share["version_set"],
                        "package_path": Path(share["version_set"]["package_path"]),
                        "weights_dir": Path(share["version_set"]["weights_dir"]),
                        "shape": Shape(**share["version_set"]["shape"]),
                    }
                ),
                weight=share["weight"],
                instances=tuple(
                    ObservedInstance(**{**instance, "health": Health(instance["health"])})
                    for instance in share["instances"]
                ),
            )
            for share in data["shares"]
        ),
    )


def _digest(dumped: str | None) -> str | None:
    """What identifies a route's published form (``dumped`` by :func:`_dump`)."""
    if dumped is None:
        return None
    return hashlib.sha256(dumped.encode()).hexdigest()
