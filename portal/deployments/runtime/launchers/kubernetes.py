"""Instances as pods: one Deployment per version set, scaled by the rollout controller.

The controller keeps its own rhythm (start, wait for ready, shift, drain); Kubernetes only
keeps the asked number of pods running. To stop *particular* pods, the launcher marks them with
the lowest ``controller.kubernetes.io/pod-deletion-cost`` and then lowers the replicas: the
ReplicaSet removes the cheapest pods first. Pods are the instances: their names appear in
:meth:`observe` once the ReplicaSet made them.

Objects come from :mod:`.k8s_objects`; this module only sends them. Nothing here was run
against a real cluster on our machines; the tests drive it against a small fake API server.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from datetime import UTC, datetime
from typing import Any

import urllib3
from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config

from portal.core.redis_clients import redis_client
from portal.deployments.runtime.launchers import k8s_objects as objects
from portal.deployments.runtime.launchers.base import (
    LOG_CHUNK_BYTES,
    LOG_CHUNK_LINES,
    LOG_DEFAULT_TAIL,
    Health,
    Launcher,
    LogChunk,
    LogCursorError,
    LogUnavailable,
    ObservedInstance,
    RegionConfig,
    Route,
    VersionSet,
)
from portal.deployments.runtime.launchers.gateway_routes import GatewayRoutes
from serving.gateway import table

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
CRASH_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
        "InvalidImageName",
    }
)
GATEWAY_API = ("gateway.networking.k8s.io", "v1", "httproutes")
#: (connect, read) seconds for a log read: a page's request must not hang on a stuck API server.
LOG_REQUEST_TIMEOUT = (5.0, 15.0)
#: The cursor of a log nothing was read from yet: the next read starts at its beginning.
LOG_START = "1970-01-01T00:00:00Z"
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z$")


def _missing(exc: ApiException) -> bool:
    return exc.status == 404


def _reason(exc: Exception) -> str:
    """A short reason for a person: the API's status, or the kind of connection failure."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason or ''}".strip()
    return type(exc).__name__


#: One client per (kubeconfig, context) in a process: a launcher is made several times per
#: controller step, and a kubeconfig may log in through a command (EKS's ``aws eks
#: get-token``) that should not run each time; the client refreshes its own credentials.
_context_clients: dict[tuple[str, str], k8s.ApiClient] = {}


def _api_client(context: str) -> k8s.ApiClient:
    """A client of the region's cluster: its kubeconfig ``context`` (each region its own
    cluster), or, with none named, the cluster this runs in, else the current context."""
    if context:
        key = (os.path.expanduser(kube_config.KUBE_CONFIG_DEFAULT_LOCATION), context)
        if key not in _context_clients:
            _context_clients[key] = k8s_config.new_client_from_config(context=context)
        return _context_clients[key]
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


class KubernetesLauncher(Launcher):
    kind = "kubernetes"

    def __init__(
        self, region: RegionConfig | None = None, api_client: k8s.ApiClient | None = None
    ) -> None:
        if api_client is None:
            api_client = _api_client(region.kubernetes_context if region else "")
        self.apps = k8s.AppsV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.namespace: str = (
            region.kubernetes_namespace if region else ""
        ) or settings.KUBERNETES_NAMESPACE
        #: A Gateway API Gateway the cluster routes with; empty: the platform's own gateway
        #: Deployment routes, from the table this launcher publishes in Redis.
        self.gateway: str = settings.KUBERNETES_GATEWAY_NAME
        prefix = region.gateway_prefix if region else settings.GATEWAY_REDIS_PREFIX
        self.platform_gateway = GatewayRoutes(redis_client(), prefix)

    # --- instances ----------------------------------------------------------------------------

    def _pods(self, version_set: VersionSet) -> list[Any]:
        selector = ",".join(f"{k}={v}" for k, v in objects.set_selector(version_set).items())
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def _scale(self, version_set: VersionSet, replicas: int) -> None:
        body = objects.deployment(
            version_set,
            replicas,
            namespace=self.namespace,
            cache_claim=settings.KUBERNETES_MODEL_CACHE_PVC,
            drain_seconds=settings.INSTANCE_DRAIN_SECONDS,
        )
        try:
            self.apps.patch_namespaced_deployment(
                version_set.key, self.namespace, {"spec": {"replicas": replicas}}
            )
        except ApiException as exc:
            if not _missing(exc):
                raise
            self.apps.create_namespaced_deployment(self.namespace, body)

    def start(self, version_set: VersionSet, count: int) -> list[str]:
        staying = [p for p in self._pods(version_set) if p.metadata.deletion_timestamp is None]
        self._scale(version_set, len(staying) + count)
        return []

    def stop(self, version_set: VersionSet, names: list[str], drain_seconds: float) -> None:
        for name in names:
            with contextlib.suppress(ApiException):
                self.core.patch_namespaced_pod(
                    name,
                    self.namespace,
                    {"metadata": {"annotations": {DELETION_COST: "-1000"}}},
                )
        staying = [
            p
            for p in self._pods(version_set)
            if p.metadata.deletion_timestamp is None and p.metadata.name not in names
        ]
        with contextlib.suppress(ApiException):
            self.apps.patch_namespaced_deployment(
                version_set.key, self.namespace, {"spec": {"replicas": len(staying)}}
            )

    def observe(self, version_set: VersionSet) -> list[ObservedInstance]:
        return [_observed(pod) for pod in self._pods(version_set)]

    def forget(self, version_set: VersionSet, names: list[str]) -> None:
        """Pods are Kubernetes' to forget; the Deployment goes once it has none left."""
        if self._pods(version_set):
            return
        try:
            current = self.apps.read_namespaced_deployment(version_set.key, self.namespace)
        except ApiException as exc:
            if _missing(exc):
                return
            raise
        if not current.spec.replicas:
            with contextlib.suppress(ApiException):
                self.apps.delete_namespaced_deployment(version_set.key, self.namespace)

    # --- logs ---------------------------------------------------------------------------------

    def read_log(
        self,
        version_set: VersionSet,
        name: str,
        *,
        since: str | None = None,
        tail: int = LOG_DEFAULT_TAIL,
    ) -> LogChunk:
        """The pod's log with Kubernetes' own timestamps; the cursor is the last line's
        timestamp. A read asks for ``since_seconds`` back to it (whole seconds, so a little
        more) and drops the lines at or before it; a first read asks for ``tail_lines``.
        ``limit_bytes`` bounds every answer. A crash-looping pod's waiting container has no
        log yet: a first read then shows its previous run's. The API server not answering
        is :class:`LogUnavailable`."""
        try:
            return self._read_log(name, since, tail)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise LogUnavailable(
                f"The cluster did not give instance {name}'s log: {_reason(exc)}"
            ) from exc

    def _read_log(self, name: str, since: str | None, tail: int) -> LogChunk:
        after = _log_time(since) if since else None
        try:
            pod = self.core.read_namespaced_pod(
                name, self.namespace, _request_timeout=LOG_REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if _missing(exc):
                return LogChunk([], since or LOG_START, ended=True)
            raise
        phase = pod.status.phase if pod.status else None
        ended = phase in ("Failed", "Succeeded")
        options: dict[str, Any] = {"timestamps": True, "limit_bytes": LOG_CHUNK_BYTES}
        if after is None:
            options["tail_lines"] = max(0, min(tail, LOG_CHUNK_LINES))
        else:
            back = datetime.now(UTC).timestamp() - after[0]
            options["since_seconds"] = max(1, math.ceil(back) + 1)
        try:
            text = self._log_text(name, options)
        except ApiException as exc:
            if exc.status != 400 or after is not None:  # 400: the container is not running
                raise
            try:
                text = self._log_text(name, {**options, "previous": True})
            except ApiException:
                text = ""
        stamped = _stamped_lines(text, full=len(text.encode()) < LOG_CHUNK_BYTES)
        if after is not None:
            stamped = [(t, line) for t, line in stamped if _log_time(t) > after]
        stamped = stamped[:LOG_CHUNK_LINES]
        cursor = stamped[-1][0] if stamped else (since or LOG_START)
        return LogChunk([line for _, line in stamped], cursor, ended=ended and not stamped)

    def _log_text(self, name: str, options: dict[str, Any]) -> str:
        # Unparsed: the client would otherwise json-decode a log that happens to be one JSON
        # line and hand back a dict's repr.
        answer = self.core.read_namespaced_pod_log(
            name,
            self.namespace,
            _preload_content=False,
            _request_timeout=LOG_REQUEST_TIMEOUT,
            **options,
        )
        return bytes(answer.data).decode("utf-8", "replace")

    # --- traffic ------------------------------------------------------------------------------

    def set_traffic(self, routes: list[Route]) -> int:
        if not self.gateway:
            # The platform's gateway pods route to the pods' addresses: no Service or route of
            # ours may offer a way around its caller keys (one left from a switch goes).
            self._sync_services({})
            return self.platform_gateway.publish(routes)
        generation = table.next_generation(redis_client(), "kubernetes:traffic")
        services: dict[str, dict[str, Any]] = {}
        http_routes: dict[str, dict[str, Any]] = {}
        for route in routes:
            for share in route.shares:
                service = objects.version_service(share.version_set, self.namespace)
                services[service["metadata"]["name"]] = service
            if "/versions/" not in route.path:
                service = objects.model_service(route, self.namespace)
                services[service["metadata"]["name"]] = service
            http_route = objects.http_route(
                route,
                namespace=self.namespace,
                gateway=self.gateway,
                gateway_namespace=settings.KUBERNETES_GATEWAY_NAMESPACE,
                generation=generation,
            )
            http_routes[http_route["metadata"]["name"]] = http_route
        self._sync_services(services)
        self._sync_http_routes(http_routes)
        return generation

    def _sync_services(self, wanted: dict[str, dict[str, Any]]) -> None:
        selector = f"app.kubernetes.io/managed-by={objects.MANAGED_BY}"
        existing = {
            s.metadata.name
            for s in self.core.list_namespaced_service(
                self.namespace, label_selector=selector
            ).items
        }
        for name, body in wanted.items():
            if name in existing:
                self.core.patch_namespaced_service(name, self.namespace, body)
            else:
                self.core.create_namespaced_service(self.namespace, body)
        for name in existing - set(wanted):
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_service(name, self.namespace)

    def _sync_http_routes(self, wanted: dict[str, dict[str, Any]]) -> None:
        group, version, plural = GATEWAY_API
        selector = f"app.kubernetes.io/managed-by={objects.MANAGED_BY}"
        listed = self.custom.list_namespaced_custom_object(
            group, version, self.namespace, plural, label_selector=selector
        )
        existing = {item["metadata"]["name"] for item in listed.get("items", [])}
        for name, body in wanted.items():
            if name in existing:
                # One write per route: all its weights change together.
                self.custom.patch_namespaced_custom_object(
                    group, version, self.namespace, plural, name, body
                )
            else:
                self.custom.create_namespaced_custom_object(
                    group, version, self.namespace, plural, body
                )
        for name in existing - set(wanted):
            with contextlib.suppress(ApiException):
                self.custom.delete_namespaced_custom_object(
                    group, version, self.namespace, plural, name
                )

    def traffic_applied(self, generation: int) -> bool:
        """The platform's gateway: every live gateway process applied ``generation``. Gateway
        API: every route written at ``generation`` or later is accepted by its gateway at its
        current ``metadata.generation``."""
        if not self.gateway:
            return self.platform_gateway.applied(generation)
        group, version, plural = GATEWAY_API
        selector = f"app.kubernetes.io/managed-by={objects.MANAGED_BY}"
        listed = self.custom.list_namespaced_custom_object(
            group, version, self.namespace, plural, label_selector=selector
        )
        for item in listed.get("items", []):
            metadata = item["metadata"]
            written = int(metadata.get("annotations", {}).get(objects.GENERATION_ANNOTATION, 0))
            if written < generation:
                return False
            parents = item.get("status", {}).get("parents", [])
            accepted = any(
                c.get("type") == "Accepted"
                and c.get("status") == "True"
                and c.get("observedGeneration") == metadata.get("generation")
                for parent in parents
                for c in parent.get("conditions", [])
            )
            if not accepted:
                return False
        return True

    def last_requests(self) -> dict[str, float] | None:
        """Recorded by the platform's gateway only; a Gateway API implementation does not say."""
        return None if self.gateway else self.platform_gateway.last_requests()

    def gateway_observations(
        self, route: str, since: float, until: float
    ) -> list[dict[str, Any]] | None:
        """Observed by the platform's gateway only, as :meth:`last_requests`."""
        return None if self.gateway else self.platform_gateway.observations(route, since, until)


def _observed(pod: Any) -> ObservedInstance:
    name = pod.metadata.name
    ip = pod.status.pod_ip if pod.status else None
    endpoints = (
        {
            "openai": f"http://{ip}:{objects.PORTS['openai']}",
            "kserve_http": f"http://{ip}:{objects.PORTS['http']}",
            "kserve_grpc": f"{ip}:{objects.PORTS['grpc']}",
            "metrics": f"http://{ip}:{objects.PORTS['openai']}/metrics",
        }
        if ip
        else {}
    )
    if pod.metadata.deletion_timestamp is not None:
        return ObservedInstance(name, Health.DRAINING, endpoints, "terminating")
    status = pod.status
    phase = status.phase if status else None
    if phase in ("Failed", "Succeeded"):
        why = (status.reason or "") + (f": {status.message}" if status.message else "")
        return ObservedInstance(
            name, Health.CRASHED, endpoints, f"pod {phase.lower()} {why}".strip()
        )
    restarts = 0
    for container in (status.container_statuses or []) if status else []:
        restarts += container.restart_count or 0
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in CRASH_REASONS:
            message = f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
            return ObservedInstance(name, Health.CRASHED, endpoints, message)
    conditions = {c.type: c for c in (status.conditions or [])} if status else {}
    ready = conditions.get("Ready")
    if ready is not None and ready.status == "True":
        return ObservedInstance(name, Health.READY, endpoints)
    if restarts:
        return ObservedInstance(name, Health.UNHEALTHY, endpoints, f"restarted {restarts} time(s)")
    scheduled = conditions.get("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        return ObservedInstance(
            name, Health.STARTING, endpoints, scheduled.message or "unscheduled"
        )
    return ObservedInstance(name, Health.STARTING, endpoints, "starting")


def _log_time(value: str) -> tuple[int, int]:
    """An RFC 3339 UTC timestamp as (Unix seconds, nanoseconds), so that Kubernetes' trimmed
    fractions (``.1Z`` after ``.12Z``) compare right."""
    match = _TIMESTAMP.match(value)
    if match is None:
        raise LogCursorError(f"since={value!r} is not a cursor of this log (an RFC 3339 time).")
    seconds = datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    return int(seconds), int((match[2] or "0").ljust(9, "0"))


def _stamped_lines(text: str, *, full: bool) -> list[tuple[str, str]]:
    """``(timestamp, line)`` pairs of a ``timestamps=true`` log; when the answer was cut at
    ``limit_bytes`` (not ``full``), its last line may be cut too and is left for the next read."""
    rows = text.split("\n")
    if rows and (rows[-1] == "" or (not full and len(rows) > 1)):
        rows.pop()
    found = []
    for row in rows:
        stamp, _, line = row.partition(" ")
        if _TIMESTAMP.match(stamp):
            found.append((stamp, line.rstrip("\r")))
    return found
