"""The Kubernetes launcher: its objects against the Kubernetes schemas, and its decisions
through the official client against a fake API server on loopback (no cluster here)."""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest

from portal.core.redis_clients import redis_client
from portal.deployments.runtime.launchers import k8s_objects as objects
from portal.deployments.runtime.launchers.base import (
    Health,
    Route,
    Shape,
    TrafficShare,
    VersionSet,
)
from portal.deployments.runtime.launchers.kubernetes import DELETION_COST
from serving.instance.supervisor import engine_process, parse_args
from tests.deployments.fake_kube_api import FakeKubeApi

SCHEMA_VERSION = kubernetes_validate.latest_version()
NS = "llm-serving"
GPU = Shape(
    name="h100x2",
    gpus=2,
    cpus=16,
    memory_gib=200,
    accelerator="nvidia-h100",
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)
CPU = Shape(name="cpu-local", cpus=2, memory_gib=8)


def version_set(version: int = 1, shape: Shape = CPU, model: str = "chat", deployment=3):
    return VersionSet(
        deployment_id=deployment,
        team="search",
        model=model,
        version=version,
        served_model_name=f"search--{model}",
        package_path=Path(f"/model-cache/packages/{'ab' * 32}.tar"),
        package_digest="ab" * 32,
        weights_dir=Path("/model-cache/models/search/chat/1"),
        shape=shape,
        image="llm-serving/serving:triton-26.07",
    )


def red_black(v1: VersionSet, v2: VersionSet, split=(75, 25)) -> Route:
    return Route(
        v1.deployment_id,
        f"{v1.team}/{v1.model}",
        (TrafficShare(v1, split[0], ()), TrafficShare(v2, split[1], ())),
    )


def versioned(the_set: VersionSet) -> Route:
    path = f"{the_set.team}/{the_set.model}/versions/{the_set.version}"
    return Route(the_set.deployment_id, path, (TrafficShare(the_set, 100, ()),))


def valid(obj: dict) -> None:
    kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


# --- the objects ------------------------------------------------------------------------------


LONG = "a-model-name-that-goes-on-and-on-and-on-well-past-any-dns-label-limit"


@pytest.mark.parametrize("shape", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("model", ["chat", LONG])
def test_every_object_validates_against_the_kubernetes_schemas(shape, model):
    v1, v2 = version_set(1, shape, model), version_set(2, shape, model)
    deployment = objects.deployment(
        v1, 2, namespace=NS, cache_claim="model-cache", drain_seconds=30
    )
    built = [
        deployment,
        objects.version_service(v1, NS),
        objects.version_service(v2, NS),
        objects.model_service(red_black(v1, v2), NS),
        objects.model_service(versioned(v2), NS),
        *objects.model_cache_volume(
            file_system_id="fs-0123456789abcdef0",
            dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
            mount_name="abcdefgh",
            size_gib=1200,
            namespace=NS,
        ),
    ]
    for obj in built:
        valid(obj)
        assert len(obj["metadata"]["name"]) <= 63
        assert all(len(v) <= 63 for v in obj["metadata"]["labels"].values())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    limits = container["resources"]["limits"]
    assert ("nvidia.com/gpu" in limits) == bool(shape.gpus)
    assert "nvidia.com/gpu" not in container["resources"]["requests"]  # GPUs in limits only
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["failureThreshold"] * 10 == 30 * 60
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert f"/model-cache/packages/{'ab' * 32}.tar" in container["command"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 30 + objects.PRE_STOP_SECONDS
    assert pod.get("nodeSelector", {}) == shape.node_selector
    assert pod["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "model-cache",
        "readOnly": True,
    }


@pytest.mark.parametrize(("shape", "engine"), [(GPU, "tritonserver"), (CPU, "cpu")])
def test_the_pod_runs_exactly_the_engine_command_the_supervisor_builds(shape, engine, monkeypatch):
    monkeypatch.delenv("TRITONSERVER_BIN", raising=False)
    deployment = objects.deployment(
        version_set(1, shape), 1, namespace=NS, cache_claim="model-cache", drain_seconds=30
    )
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python3", "-m", "serving.instance"]
    args = parse_args(command[3:], check_package=False)
    assert args.engine == engine
    engine_command = engine_process(
        args, Path("/work/repository"), "search--chat", Path("/work/prometheus")
    ).command
    executable = (
        ["/opt/tritonserver/bin/tritonserver"]
        if engine == "tritonserver"
        else [sys.executable, "-m", "serving.kserve"]
    )
    assert engine_command == [
        *executable,
        "--model-repository=/work/repository",
        "--http-address=0.0.0.0",
        "--http-port=8000",
        "--grpc-address=0.0.0.0",
        "--grpc-port=8001",
        "--metrics-address=0.0.0.0",
        "--metrics-port=8002",
        "--allow-metrics=true",
        "--allow-gpu-metrics=true",
        "--model-control-mode=explicit",
        "--load-model=search--chat",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--exit-timeout-secs=30",
        "--log-verbose=0",
        "--log-info=true",
        "--log-warning=true",
        "--log-error=true",
    ]
    container_ports = {
        p["name"]: p["containerPort"]
        for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert container_ports["http"] == 8000  # the probes reach the engine's own HTTP port


def test_an_instance_type_can_force_the_engine():
    forced = Shape(name="gpu-smoke", gpus=1, engine="cpu")
    assert forced.serving_engine == "cpu"
    assert Shape(name="gpu", gpus=1).serving_engine == "tritonserver"


@pytest.mark.parametrize("model", ["chat", LONG])
def test_http_routes_have_the_gateway_api_shape(model):
    """HTTPRoute is a CRD the bundled schemas do not carry: check it against Gateway API v1's
    documented shape (gateway-api.sigs.k8s.io/reference/spec/#httproute)."""
    v1, v2 = version_set(1, model=model), version_set(2, model=model)
    for route, expected in ((red_black(v1, v2), [75, 25]), (versioned(v2), [100])):
        obj = objects.http_route(
            route, namespace=NS, gateway="public", gateway_namespace="gateways", generation=7
        )
        assert (obj["apiVersion"], obj["kind"]) == ("gateway.networking.k8s.io/v1", "HTTPRoute")
        assert len(obj["metadata"]["name"]) <= 63
        assert obj["metadata"]["annotations"] == {objects.GENERATION_ANNOTATION: "7"}
        assert obj["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateways"}]
        base = f"/models/{route.path}"
        for rule, (matched, target, port) in zip(
            obj["spec"]["rules"],
            ((f"{base}/v1", "/v1", 9000), (f"{base}/v2", "/v2", 8000), (base, "/v1", 9000)),
            strict=True,
        ):
            [match] = rule["matches"]
            assert match["path"] == {"type": "PathPrefix", "value": matched}
            [rewrite] = rule["filters"]
            assert rewrite["urlRewrite"]["path"]["replacePrefixMatch"] == target
            assert [b["weight"] for b in rule["backendRefs"]] == expected
            assert {b["port"] for b in rule["backendRefs"]} == {port}
            assert all(len(b["name"]) <= 63 for b in rule["backendRefs"])


# --- the launcher against an API server -----------------------------------------------------


@pytest.fixture
def api():
    fake = FakeKubeApi()
    yield fake
    fake.close()


@pytest.fixture
def launcher(api, settings, clean_redis):
    settings.KUBERNETES_NAMESPACE = NS
    settings.KUBERNETES_GATEWAY_NAME = "public"
    return api.launcher()


def pod(the_set: VersionSet, name: str, **status) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": objects.set_labels(the_set)},
        "spec": {"containers": [{"name": "instance", "image": the_set.image}]},
        "status": {"phase": "Running", "podIP": "10.0.0.7", **status},
    }


def ready(value: str = "True") -> dict:
    return {"conditions": [{"type": "Ready", "status": value}]}


def replicas(api: FakeKubeApi, the_set: VersionSet) -> int:
    deployment = api.get("deployments", NS, the_set.key)
    assert deployment is not None
    return deployment["spec"]["replicas"]


def test_start_creates_the_deployment_then_scales_it(api, launcher):
    the_set = version_set()
    assert launcher.start(the_set, 1) == []  # pod names come from the ReplicaSet
    created = api.get("deployments", NS, the_set.key)
    assert created is not None and created["spec"]["replicas"] == 1
    valid(created)
    api.put("pods", NS, pod(the_set, "p1", **ready()))
    launcher.start(the_set, 2)
    assert replicas(api, the_set) == 3
    launcher.start(the_set, 2)  # pods not there yet: a retried step asks for the same
    assert replicas(api, the_set) == 3


def test_stop_removes_exactly_the_named_pods(api, launcher):
    the_set = version_set()
    launcher.start(the_set, 3)
    for name in ("p1", "p2", "p3"):
        api.put("pods", NS, pod(the_set, name, **ready()))
    launcher.stop(the_set, ["p2"], drain_seconds=30)
    assert api.get("pods", NS, "p2")["metadata"]["annotations"] == {DELETION_COST: "-1000"}
    assert "annotations" not in api.get("pods", NS, "p1")["metadata"]
    assert replicas(api, the_set) == 2
    launcher.stop(the_set, ["p2", "gone-already"], drain_seconds=30)  # idempotent
    assert replicas(api, the_set) == 2


def test_observe_reads_pod_states(api, launcher):
    the_set = version_set()
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}}
    crash = {"containerStatuses": [status_of(waiting, restarts=4)], **ready("False")}
    api.put("pods", NS, pod(the_set, "ready", **ready()))
    api.put("pods", NS, pod(the_set, "loading", **ready("False")))
    api.put("pods", NS, pod(the_set, "crashing", **crash))
    api.put(
        "pods",
        NS,
        pod(the_set, "flaky", containerStatuses=[status_of({"running": {}}, 1)], **ready("False")),
    )
    draining = pod(the_set, "draining", **ready())
    draining["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    api.put("pods", NS, draining)
    api.put("pods", NS, pod(version_set(2), "other-version", **ready()))
    seen = {i.name: i for i in launcher.observe(the_set)}
    assert {name: i.health for name, i in seen.items()} == {
        "crashing": Health.CRASHED,
        "draining": Health.DRAINING,
        "flaky": Health.UNHEALTHY,
        "loading": Health.STARTING,
        "ready": Health.READY,
    }
    assert seen["crashing"].message == "CrashLoopBackOff: back-off 5m0s"
    assert seen["ready"].endpoints["kserve_http"] == "http://10.0.0.7:8000"


def status_of(state: dict, restarts: int) -> dict:
    return {
        "name": "instance",
        "ready": False,
        "restartCount": restarts,
        "image": "i",
        "imageID": "",
        "state": state,
    }


def test_traffic_is_one_write_per_route_and_stale_routes_go(api, launcher):
    v1, v2 = version_set(1), version_set(2)
    other = version_set(1, model="tagger", deployment=9)
    generation = launcher.set_traffic([red_black(v1, v2), versioned(other)])
    # A version Service per version set; one model Service for the Red-Black route only.
    assert api.names("services") == sorted([v1.key, v2.key, other.key, "search-chat"])
    route = api.get("httproutes", NS, "search-chat")
    assert [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]] == [75, 25]
    assert not launcher.traffic_applied(generation)  # the gateway has not accepted it yet
    for name in api.names("httproutes"):
        accept(api, name)
    assert launcher.traffic_applied(generation)

    newer = launcher.set_traffic([red_black(v1, v2, split=(0, 100))])
    route = api.get("httproutes", NS, "search-chat")
    assert [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]] == [0, 100]
    assert api.names("httproutes") == ["search-chat"]  # the tagger's route is gone
    assert other.key not in api.names("services")
    assert not launcher.traffic_applied(newer)  # its new spec is not accepted yet
    accept(api, "search-chat")
    assert launcher.traffic_applied(newer)


def test_traffic_published_after_redis_lost_its_data_counts_as_newer(api, launcher):
    """The generation a step waits for was taken before a FLUSHDB; the routes written after it
    must satisfy it (a counter restarted at 1 left the controller waiting for ever)."""
    v1, v2 = version_set(1), version_set(2)
    before = launcher.set_traffic([red_black(v1, v2)])
    redis_client().flushdb()
    after = launcher.set_traffic([red_black(v1, v2, split=(0, 100))])
    assert after > before
    accept(api, "search-chat")
    assert launcher.traffic_applied(before)


def accept(api: FakeKubeApi, name: str) -> None:
    """What a Gateway controller does: accept the route's current generation."""
    route = api.get("httproutes", NS, name)
    generation = route["metadata"]["generation"]
    condition = {"type": "Accepted", "status": "True", "observedGeneration": generation}
    route["status"] = {"parents": [{"parentRef": {"name": "public"}, "conditions": [condition]}]}


def test_forget_deletes_an_empty_deployment_only(api, launcher):
    the_set = version_set()
    launcher.start(the_set, 1)
    api.put("pods", NS, pod(the_set, "p1", **ready()))
    launcher.stop(the_set, ["p1"], drain_seconds=30)
    launcher.forget(the_set, ["p1"])
    assert api.get("deployments", NS, the_set.key) is not None  # its pod still terminates
    api.objects.pop(("pods", NS, "p1"))
    launcher.forget(the_set, ["p1"])
    assert api.get("deployments", NS, the_set.key) is None
