"""The Kubernetes objects of the platform, as plain dicts: one code path builds what the
Kubernetes launcher sends and what the tests validate against the Kubernetes schemas.

- One ``apps/v1`` **Deployment** per version set (model, version, deployment), whose replicas
  the controller sets: Kubernetes never rolls its template itself (``Recreate`` with a template
  that never changes), the platform's controller does the rolling.
- One **Service** per version set (the backend an ``HTTPRoute`` weighs), and for Red-Black one
  per model selecting the ready pods of every version of the deployment (traffic then follows
  the ready pod counts, which the stages set; with Gateway API the weights are exact).
- A Gateway API **HTTPRoute** per deployment where the cluster has a Gateway: the gateway's
  paths (``/models/<team>/<model>/[versions/<n>/]``) with ``v1/`` going to the OpenAI port and
  ``v2/`` to KServe HTTP, weighted per version.
- For operators, the model cache's **PersistentVolume** and claim on FSx for Lustre through the
  ``fsx.csi.aws.com`` driver.
"""

from __future__ import annotations

from typing import Any

from portal.deployments.runtime.launchers.base import Route, VersionSet, dns_label

MANAGED_BY = "llm-serving-platform"
LABEL_DEPLOYMENT = "llm-serving/deployment"
LABEL_MODEL = "llm-serving/model"
LABEL_VERSION = "llm-serving/version"
GENERATION_ANNOTATION = "llm-serving/traffic-generation"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
CACHE_MOUNT = "/model-cache"
#: Weights of a large model can take many minutes to load: the startup probe allows 30.
STARTUP_BUDGET_SECONDS = 30 * 60
PROBE_PERIOD_SECONDS = 10
#: Time for endpoints to drop a terminating pod before it gets SIGTERM.
PRE_STOP_SECONDS = 5

Obj = dict[str, Any]


def common_labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "llm-serving", "app.kubernetes.io/managed-by": MANAGED_BY}


def set_labels(version_set: VersionSet) -> dict[str, str]:
    return {
        **common_labels(),
        LABEL_DEPLOYMENT: str(version_set.deployment_id),
        LABEL_MODEL: dns_label(version_set.team, version_set.model),
        LABEL_VERSION: str(version_set.version),
    }


def set_selector(version_set: VersionSet) -> dict[str, str]:
    return {
        LABEL_DEPLOYMENT: str(version_set.deployment_id),
        LABEL_VERSION: str(version_set.version),
    }


def _meta(name: str, namespace: str, labels: dict[str, str]) -> Obj:
    return {"name": name, "namespace": namespace, "labels": labels}


def deployment(
    version_set: VersionSet,
    replicas: int,
    *,
    namespace: str,
    cache_claim: str,
    drain_seconds: float,
) -> Obj:
    shape = version_set.shape
    resources: Obj = {
        "requests": {"cpu": str(shape.cpus), "memory": f"{shape.memory_gib}Gi"},
        "limits": {"cpu": str(shape.cpus), "memory": f"{shape.memory_gib}Gi"},
    }
    if shape.gpus:
        # GPUs go in limits only: the request defaults to the limit.
        resources["limits"]["nvidia.com/gpu"] = str(shape.gpus)
    package = f"{CACHE_MOUNT}/packages/{version_set.package_digest}.tar"
    command = [
        "python3", "-m", "serving.instance", "--package", package, "--workdir", "/work",
        "--engine", shape.serving_engine,
        "--host", "0.0.0.0", "--http-port", str(PORTS["http"]), "--grpc-port", str(PORTS["grpc"]),
        "--metrics-port", str(PORTS["metrics"]), "--openai-port", str(PORTS["openai"]),
        "--ready-timeout", str(STARTUP_BUDGET_SECONDS), "--drain-timeout", str(drain_seconds),
    ]  # fmt: skip
    ready = {"httpGet": {"path": "/v2/health/ready", "port": "http"}}
    container = {
        "name": "instance",
        "image": version_set.image,
        "command": command,
        "ports": [{"name": name, "containerPort": port} for name, port in PORTS.items()],
        "resources": resources,
        "startupProbe": {
            **ready,
            "periodSeconds": PROBE_PERIOD_SECONDS,
            "failureThreshold": STARTUP_BUDGET_SECONDS // PROBE_PERIOD_SECONDS,
        },
        "readinessProbe": {**ready, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": PROBE_PERIOD_SECONDS,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SECONDS)]}}},
        "volumeMounts": [
            {"name": "model-cache", "mountPath": CACHE_MOUNT, "readOnly": True},
            {"name": "work", "mountPath": "/work"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod_spec: Obj = {
        "containers": [container],
        "terminationGracePeriodSeconds": int(PRE_STOP_SECONDS + drain_seconds + 15),
        "volumes": [
            {
                "name": "model-cache",
                "persistentVolumeClaim": {"claimName": cache_claim, "readOnly": True},
            },
            {"name": "work", "emptyDir": {}},
        ],
    }
    if shape.node_selector:
        pod_spec["nodeSelector"] = dict(shape.node_selector)
    if shape.tolerations:
        pod_spec["tolerations"] = list(shape.tolerations)
    labels = set_labels(version_set)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(version_set.key, namespace, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": set_selector(version_set)},
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _service(name: str, namespace: str, labels: dict[str, str], selector: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, labels),
        "spec": {
            "selector": selector,
            "ports": [
                {"name": name_, "port": port, "targetPort": name_} for name_, port in PORTS.items()
            ],
        },
    }


def version_service(version_set: VersionSet, namespace: str) -> Obj:
    return _service(version_set.key, namespace, set_labels(version_set), set_selector(version_set))


def model_service_name(route: Route) -> str:
    return dns_label(route.path.replace("/versions/", "-v").replace("/", "-"))


def model_service(route: Route, namespace: str) -> Obj:
    """Red-Black: one Service over the ready pods of every version of the deployment."""
    labels = {**common_labels(), LABEL_DEPLOYMENT: str(route.deployment_id)}
    selector = {LABEL_DEPLOYMENT: str(route.deployment_id)}
    return _service(model_service_name(route), namespace, labels, selector)


def http_route(
    route: Route, *, namespace: str, gateway: str, gateway_namespace: str, generation: int
) -> Obj:
    prefix = f"/models/{route.path}"
    parent: Obj = {"name": gateway}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace
    rules = []
    # The same paths as the local gateway (serving.gateway.proxy.upstream_of): v2/ to KServe,
    # v1/ to the OpenAI front end, and the OpenAI routes right under the base URL too (the
    # longest matching prefix wins, so the first two keep theirs).
    for match, target, port in (
        (f"{prefix}/v1", "/v1", PORTS["openai"]),
        (f"{prefix}/v2", "/v2", PORTS["http"]),
        (prefix, "/v1", PORTS["openai"]),
    ):
        rules.append(
            {
                "matches": [{"path": {"type": "PathPrefix", "value": match}}],
                "filters": [
                    {
                        "type": "URLRewrite",
                        "urlRewrite": {
                            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": target}
                        },
                    }
                ],
                "backendRefs": [
                    {"name": share.version_set.key, "port": port, "weight": share.weight}
                    for share in route.shares
                ],
            }
        )
    metadata = _meta(
        model_service_name(route),
        namespace,
        {**common_labels(), LABEL_DEPLOYMENT: str(route.deployment_id)},
    )
    metadata["annotations"] = {GENERATION_ANNOTATION: str(generation)}
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata,
        "spec": {"parentRefs": [parent], "rules": rules},
    }


def model_cache_volume(
    *, file_system_id: str, dns_name: str, mount_name: str, size_gib: int, namespace: str
) -> list[Obj]:
    """A static PersistentVolume on an existing FSx for Lustre file system, and the claim the
    instances mount (``KUBERNETES_MODEL_CACHE_PVC``). Workers mount the same file system."""
    name = "model-cache"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{name}-{file_system_id}", "labels": common_labels()},
            "spec": {
                "capacity": {"storage": f"{size_gib}Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "csi": {
                    "driver": "fsx.csi.aws.com",
                    "volumeHandle": file_system_id,
                    "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": _meta(name, namespace, common_labels()),
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": f"{name}-{file_system_id}",
                "resources": {"requests": {"storage": f"{size_gib}Gi"}},
            },
        },
    ]


#: The platform gateway's port, in the pod and on its Service.
GATEWAY_PORT = 8080
#: The gateway's /metrics, for the cluster's scrapers: a container port the Service leaves out.
GATEWAY_METRICS_PORT = 9091
GATEWAY_NAME = "llm-serving-gateway"


def gateway_objects(
    *,
    namespace: str,
    image: str,
    replicas: int,
    redis_secret: str,
    redis_prefix: str,
    drain_seconds: int = 30,
) -> list[Obj]:
    """The platform's gateway in the cluster, for operators to apply once: a Deployment of
    ``replicas`` pods (each runs the same supervised gateway processes as a local one), the
    Service callers and an Ingress or Gateway reach it by, and a PodDisruptionBudget that keeps
    all but one pod through node drains. It reads the routing table and the caller keys from the
    platform's Redis (the URL from the Secret ``redis_secret``, key ``url``), never from the
    database, and keeps copies on the pod so a restarted container starts with routes.

    Labelled apart from the objects the launcher manages, which it prunes."""
    labels = {
        "app.kubernetes.io/name": GATEWAY_NAME,
        "app.kubernetes.io/component": "gateway",
        "app.kubernetes.io/part-of": "llm-serving",
    }
    selector = {"app.kubernetes.io/name": GATEWAY_NAME}
    state = "/var/lib/gateway"
    health = {"httpGet": {"path": "/healthz", "port": "http"}}
    command = [
        "python", "-m", "serving.gateway", "--host", "0.0.0.0",
        "--port", str(GATEWAY_PORT), "--prefix", redis_prefix,
        "--drain-timeout", str(drain_seconds),
        "--metrics-port", str(GATEWAY_METRICS_PORT),
        # Callers reach the pods through the cluster's balancer or ingress: every connection
        # comes from its few addresses, so no cap per client address.
        "--max-connections-per-client", "0",
        "--table-file", f"{state}/table.json", "--keys-file", f"{state}/keys.json",
    ]  # fmt: skip
    container = {
        "name": "gateway",
        "image": image,
        "command": command,
        "env": [
            {
                "name": "REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": redis_secret, "key": "url"}},
            }
        ],
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT},
        ],
        "resources": {
            "requests": {"cpu": "1", "memory": "512Mi"},
            "limits": {"memory": "1Gi"},
        },
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        # Time for the Service's endpoints to drop the pod before it stops accepting.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SECONDS)]}}},
        # The root file system is read-only: the saved table and keys, and the supervisor's
        # metrics directory (under /tmp), go to the pod's own volumes.
        "volumeMounts": [
            {"name": "state", "mountPath": state},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }
    pod_spec: Obj = {
        "containers": [container],
        "terminationGracePeriodSeconds": PRE_STOP_SECONDS + drain_seconds + 10,
        "volumes": [{"name": "state", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        "securityContext": {"runAsNonRoot": True},
        # One pod per node where the cluster allows it: a node lost takes one pod, not all.
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": selector},
            }
        ],
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(GATEWAY_NAME, namespace, labels),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(GATEWAY_NAME, namespace, labels),
            "spec": {
                "selector": selector,
                "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": "http"}],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(GATEWAY_NAME, namespace, labels),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        },
    ]
