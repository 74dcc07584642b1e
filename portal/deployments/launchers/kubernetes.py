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
from typing import Any

from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from portal.core.redis_clients import redis_client
from portal.deployments.launchers import k8s_objects as objects
from portal.deployments.launchers.base import (
    Health,
    Launcher,
    ObservedInstance,
    Route,
    VersionSet,
)

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


def _missing(exc: ApiException) -> bool:
    return exc.status == 404


class KubernetesLauncher(Launcher):
    kind = "kubernetes"

    def __init__(self, api_client: k8s.ApiClient | None = None) -> None:
        if api_client is None:
            try:
                k8s_config.load_incluster_config()
            except k8s_config.ConfigException:
                k8s_config.load_kube_config()
            api_client = k8s.ApiClient()
        self.apps = k8s.AppsV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.namespace: str = settings.KUBERNETES_NAMESPACE
        self.gateway: str = settings.KUBERNETES_GATEWAY_NAME

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

    # --- traffic ------------------------------------------------------------------------------

    def set_traffic(self, routes: list[Route]) -> int:
        generation = int(redis_client().incr("kubernetes:traffic"))
        services: dict[str, dict[str, Any]] = {}
        http_routes: dict[str, dict[str, Any]] = {}
        for route in routes:
            for share in route.shares:
                service = objects.version_service(share.version_set, self.namespace)
                services[service["metadata"]["name"]] = service
            if "/versions/" not in route.path:
                service = objects.model_service(route, self.namespace)
                services[service["metadata"]["name"]] = service
            if self.gateway:
                http_route = objects.http_route(
                    route,
                    namespace=self.namespace,
                    gateway=self.gateway,
                    gateway_namespace=settings.KUBERNETES_GATEWAY_NAMESPACE,
                    generation=generation,
                )
                http_routes[http_route["metadata"]["name"]] = http_route
        self._sync_services(services)
        if self.gateway:
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
        """With Gateway API: every route written at ``generation`` or later is accepted by its
        gateway at its current ``metadata.generation``. Without it, Kubernetes itself takes a
        terminating pod out of its Services' endpoints (the preStop pause covers the delay)."""
        if not self.gateway:
            return True
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
