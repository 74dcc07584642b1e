"""On Kubernetes the platform's gateway is the request path too: the Kubernetes launcher
publishes its pods' addresses as the routing table, and a real gateway process following it
checks caller keys before it forwards. Pods are stand-in servers on their own loopback
addresses (127.0.0.2, 127.0.0.3), listed by a fake API server; the gateway, Redis and the
launcher's code are the real ones."""

from __future__ import annotations

import httpx
import pytest
import redis
import yaml
from django.conf import settings
from django.core.management import CommandError, call_command

from portal.deployments.models import Region
from portal.deployments.runtime.launchers import k8s_objects as objects
from portal.deployments.runtime.launchers.base import Health, Route, TrafficShare
from tests.conftest import stop_process_group
from tests.deployments.fake_kube_api import FakeKubeApi
from tests.deployments.rollout_helpers import start_gateway, wait_for
from tests.deployments.test_kubernetes_launcher import (
    NS,
    pod,
    ready,
    valid,
    version_set,
)
from tests.gateway.test_gateway import (
    AUTH,
    SEARCH_AUTH,
    SEARCH_KEY,
    T_KEY,
    key_entry,
    publish_keys,
)
from tests.ports import free_port


@pytest.fixture
def api():
    fake = FakeKubeApi()
    yield fake
    fake.close()


@pytest.fixture
def launcher(api, settings, clean_redis):
    settings.KUBERNETES_NAMESPACE = NS
    settings.KUBERNETES_GATEWAY_NAME = ""  # the platform's gateway routes
    return api.launcher()


@pytest.fixture
def gateway(clean_redis):
    client = redis.Redis.from_url(settings.REDIS_URL)
    publish_keys(client, key_entry(T_KEY, "t"), key_entry(SEARCH_KEY, "search"))
    proc, url = start_gateway(settings.REDIS_URL)
    yield url
    stop_process_group(proc)


def test_callers_reach_pods_through_the_gateway_only_with_a_key(
    api, launcher, gateway, backends, monkeypatch
):
    port = free_port()
    # Every pod listens on the same ports at its own address, as in a cluster.
    monkeypatch.setitem(objects.PORTS, "openai", port)
    monkeypatch.setitem(objects.PORTS, "http", port)
    v1, v2 = version_set(1), version_set(2)
    backends("pod-v1", host="127.0.0.2", port=port)
    backends("pod-v2", host="127.0.0.3", port=port)
    api.put("pods", NS, pod(v1, "chat-v1-a", podIP="127.0.0.2", **ready()))
    api.put("pods", NS, pod(v2, "chat-v2-a", podIP="127.0.0.3", **ready()))
    api.put("services", NS, objects.version_service(v1, NS))  # left from Gateway API mode

    def serving(the_set):
        return tuple(i for i in launcher.observe(the_set) if i.health == Health.READY)

    route = Route(3, "search/chat", (TrafficShare(v1, 100, serving(v1)),))
    generation = launcher.set_traffic([route])
    assert api.names("services") == []  # no way around the gateway's keys
    wait_for(lambda: launcher.traffic_applied(generation), 10, "the gateway to apply the table")

    endpoint = f"{gateway}/models/search/chat/v1/completions"
    assert httpx.post(endpoint, json={}).status_code == 401
    assert httpx.post(endpoint, json={}, headers=AUTH).status_code == 403  # team t's key
    answer = httpx.post(endpoint, json={}, headers=SEARCH_AUTH)
    assert answer.status_code == 200
    assert answer.json()["backend"] == "pod-v1"
    assert answer.json()["auth"] == ""  # the caller's key stays at the gateway

    # A stage: every request to v2, through the same gateway.
    shares = (TrafficShare(v1, 0, serving(v1)), TrafficShare(v2, 100, serving(v2)))
    newer = launcher.set_traffic([Route(3, "search/chat", shares)])
    wait_for(lambda: launcher.traffic_applied(newer), 10, "the gateway to apply the stage")
    assert httpx.post(endpoint, json={}, headers=SEARCH_AUTH).json()["backend"] == "pod-v2"
    # The gateway records the route's last call, so the Versioned clean-up works here too.
    wait_for(lambda: "search/chat" in (launcher.last_requests() or {}), 10, "last request")


def test_the_gateway_objects_validate_and_survive_a_node_drain():
    built = objects.gateway_objects(
        namespace=NS,
        image="llm-serving-platform-portal:1.0",
        replicas=3,
        redis_secret="llm-serving-redis",
        redis_prefix="gateway",
    )
    for obj in built:
        valid(obj)
    deployment, service, budget = built
    assert [o["kind"] for o in built] == ["Deployment", "Service", "PodDisruptionBudget"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector == budget["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["maxUnavailable"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "serving.gateway"]
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env["REDIS_URL"]  # a Secret, never a literal
    # The launcher prunes what it manages; the gateway is not among it.
    assert objects.MANAGED_BY not in deployment["metadata"]["labels"].values()


def test_the_manifest_command_prints_applyable_yaml(capsys):
    call_command("gateway_manifests", "--image", "portal:7", "--replicas", "2")
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == ["Deployment", "Service", "PodDisruptionBudget"]
    for document in documents:
        valid(document)
    with pytest.raises(CommandError, match="at least 2"):
        call_command("gateway_manifests", "--replicas", "1")


def test_a_regions_gateways_follow_its_table_in_its_namespace(capsys, db):
    Region.objects.create(name="eu-west", kubernetes_namespace="serving-eu")
    call_command("gateway_manifests", "--region", "eu-west")
    deployment, *_ = yaml.safe_load_all(capsys.readouterr().out)
    assert deployment["metadata"]["namespace"] == "serving-eu"
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--prefix") + 1] == "gateway.eu-west"
    valid(deployment)
    with pytest.raises(CommandError, match="No region 'mars'"):
        call_command("gateway_manifests", "--region", "mars")


def test_gateway_api_mode_still_writes_weighted_routes(api, settings, clean_redis):
    """With KUBERNETES_GATEWAY_NAME the cluster's Gateway routes and no table is published
    (caller keys are then not checked: docs/operations.md)."""
    settings.KUBERNETES_NAMESPACE = NS
    settings.KUBERNETES_GATEWAY_NAME = "public"
    launcher = api.launcher()
    v1 = version_set(1)
    launcher.set_traffic([Route(3, "search/chat", (TrafficShare(v1, 100, ()),))])
    assert api.names("httproutes") == ["search-chat"]
    assert redis.Redis.from_url(settings.REDIS_URL).get("gateway:routes") is None
    assert launcher.last_requests() is None
