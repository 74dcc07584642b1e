"""One cluster per region through the official client: each region's Kubernetes launcher
reaches its own cluster by its kubeconfig context, works in its own namespace, and publishes
its routes into its own region's gateway table.

Two fake API servers on loopback play the two clusters (``fake_kube_api``); a kubeconfig in
the test's directory names them as two contexts, and the launchers are made as the platform
makes them (:func:`get_launcher` of a ``Region`` row), so the client is built by
``kubernetes.config.new_client_from_config(context=...)`` for real.
"""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.config import ConfigException, kube_config

from portal.core.actors import Actor
from portal.deployments import services
from portal.deployments.models import Deployment, Instance, InstanceState, ObservedState, Region
from portal.deployments.runtime.launchers import get_launcher, region_config, version_set
from portal.deployments.runtime.launchers import k8s_objects as objects
from portal.deployments.runtime.launchers.kubernetes import KubernetesLauncher
from portal.deployments.traffic import routing
from serving.gateway import table
from tests.deployments.fake_kube_api import FakeKubeApi
from tests.deployments.test_controller import ready_version
from tests.deployments.test_kubernetes_launcher import valid
from tests.factories import make_model

USER = Actor(label="user:test")
#: region → its namespace; its kubeconfig context is named after the region.
PLACES = {"us-east": "serving-us", "eu-west": "serving-eu"}


@pytest.fixture
def clusters():
    """Two clusters, one per region: region name → its fake API server."""
    made = {name: FakeKubeApi() for name in PLACES}
    yield made
    for fake in made.values():
        fake.close()


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch, clusters):
    """A kubeconfig with a cluster, user and context per region (plain http, no auth), its
    current context none of them: a launcher that ignored its region's context would fail."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": f"{name}-cluster", "cluster": {"server": fake.url}}
            for name, fake in clusters.items()
        ],
        "users": [{"name": f"{name}-user", "user": {}} for name in clusters],
        "contexts": [
            {
                "name": name,
                "context": {
                    "cluster": f"{name}-cluster",
                    "user": f"{name}-user",
                    "namespace": "not-the-region-namespace",
                },
            }
            for name in clusters
        ],
        "current-context": "nowhere",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    # The official client reads KUBECONFIG once, when it is imported (kube_config's
    # KUBE_CONFIG_DEFAULT_LOCATION): a portal process gets it from its environment at start;
    # this process imported the client long before the test set it.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


@pytest.fixture
def regions(db, kubeconfig, settings, clean_redis) -> dict[str, Region]:
    settings.KUBERNETES_NAMESPACE = "llm-serving"  # the platform's: no region uses it
    settings.KUBERNETES_GATEWAY_NAME = ""  # the platform's own gateway routes
    return {
        name: Region.objects.create(
            name=name, launcher="kubernetes", kubernetes_context=name, kubernetes_namespace=ns
        )
        for name, ns in PLACES.items()
    }


@pytest.fixture
def deployed(regions, team, release, artifact_root, cpu_instance_type):
    """One model's v1, a Red-Black deployment of it in each region: region name → deployment."""
    model = make_model(team, "chat")
    v1 = ready_version(model, artifact_root)
    return {
        name: services.create_deployment(
            model=model,
            strategy="red_black",
            version=v1,
            instance_type=cpu_instance_type,
            actor=USER,
            replicas=2,
            region=region,
        )
        for name, region in regions.items()
    }


def other(name: str) -> str:
    return next(n for n in PLACES if n != name)


def test_each_region_launches_in_its_own_cluster_and_namespace(clusters, regions, deployed):
    launchers = {name: get_launcher(region) for name, region in regions.items()}
    sets = {name: version_set(d, d.target_version) for name, d in deployed.items()}
    for name, launcher in launchers.items():
        assert isinstance(launcher, KubernetesLauncher)
        assert launcher.namespace == PLACES[name]
        # The client's server is the region's cluster, from its context in the kubeconfig.
        assert launcher.apps.api_client.configuration.host == clusters[name].url
        launcher.start(sets[name], 2)

    for name, fake in clusters.items():
        ns = PLACES[name]
        deployments = [key for key in fake.objects if key[0] == "deployments"]
        assert deployments == [("deployments", ns, sets[name].key)]  # its own set, nothing else
        created = fake.get("deployments", ns, sets[name].key)
        assert created is not None
        assert created["metadata"]["namespace"] == ns
        assert created["spec"]["replicas"] == 2
        valid(created)  # still a valid apps/v1 Deployment
        assert fake.get("deployments", PLACES[other(name)], sets[other(name)].key) is None
        # Every request this cluster saw was in the region's namespace.
        assert fake.requests, name
        assert all(f"/namespaces/{ns}/" in path for _, path in fake.requests), fake.requests

    # A pod in one cluster is seen by that region's launcher only.
    us, eu = sets["us-east"], sets["eu-west"]
    clusters["us-east"].put(
        "pods",
        PLACES["us-east"],
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "us-pod-1",
                "namespace": PLACES["us-east"],
                "labels": objects.set_labels(us),
            },
            "spec": {"containers": [{"name": "instance", "image": us.image}]},
            "status": {
                "phase": "Running",
                "podIP": "10.1.0.5",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
    )
    assert [i.name for i in launchers["us-east"].observe(us)] == ["us-pod-1"]
    assert launchers["eu-west"].observe(us) == []
    assert launchers["eu-west"].observe(eu) == []


def serve(deployment: Deployment, pods: list[str], ip: str) -> None:
    """Make the deployment serving v1 on ready instances named after pods of its cluster."""
    Deployment.objects.filter(pk=deployment.pk).update(
        observed_state=ObservedState.SERVING, traffic={deployment.target_version.number: 100}
    )
    for index, pod in enumerate(pods):
        Instance.objects.create(
            deployment=deployment,
            version=deployment.target_version,
            launcher="kubernetes",
            name=pod,
            state=InstanceState.READY,
            endpoints={
                "openai": f"http://{ip}{index}:9000",
                "kserve_http": f"http://{ip}{index}:8000",
            },
        )
    deployment.refresh_from_db()


def published(clean_redis, prefix: str) -> tuple[int, list[table.RouteEntry]] | None:
    raw = clean_redis.get(f"{prefix}:routes")
    return None if raw is None else table.parse(raw)


def backends(entries: list[table.RouteEntry]) -> set[str]:
    return {b.name for entry in entries for group in entry.groups for b in group.backends}


def test_each_regions_gateways_see_only_their_regions_pods(
    clusters, regions, deployed, clean_redis, settings
):
    serve(deployed["us-east"], ["us-pod-1", "us-pod-2"], "10.1.0.")
    serve(deployed["eu-west"], ["eu-pod-1"], "10.2.0.")
    prefixes = {name: region.gateway_prefix for name, region in regions.items()}
    assert len({*prefixes.values(), settings.GATEWAY_REDIS_PREFIX}) == 3

    routing.publish(deployed["us-east"])
    got = published(clean_redis, prefixes["us-east"])
    assert got is not None
    _, entries = got
    assert [e.path for e in entries] == [routing.route_path(deployed["us-east"])]
    assert backends(entries) == {"us-pod-1", "us-pod-2"}
    assert {b.openai for e in entries for g in e.groups for b in g.backends} == {
        "http://10.1.0.0:9000",
        "http://10.1.0.1:9000",
    }
    # Nothing yet for the other region's gateways, nor in the platform's own table.
    assert published(clean_redis, prefixes["eu-west"]) is None
    assert published(clean_redis, settings.GATEWAY_REDIS_PREFIX) is None

    routing.publish(deployed["eu-west"])
    us_after = published(clean_redis, prefixes["us-east"])
    eu_got = published(clean_redis, prefixes["eu-west"])
    assert us_after == got  # the us-east table was not touched by eu-west's publication
    assert eu_got is not None
    assert backends(eu_got[1]) == {"eu-pod-1"}
    assert published(clean_redis, settings.GATEWAY_REDIS_PREFIX) is None

    # The platform's gateway routes to the pods: no Service or HTTPRoute in either cluster,
    # and each cluster was only asked about its own region's namespace.
    for name, fake in clusters.items():
        assert fake.names("services") == [] and fake.names("httproutes") == []
        assert fake.requests, name
        assert all(f"/namespaces/{PLACES[name]}/" in p for _, p in fake.requests)

    # Every region's table at once (beat's backstop) keeps each one to its own pods.
    routing.publish()
    assert backends(published(clean_redis, prefixes["us-east"])[1]) == {"us-pod-1", "us-pod-2"}
    assert backends(published(clean_redis, prefixes["eu-west"])[1]) == {"eu-pod-1"}


def test_a_launcher_publishes_only_into_its_regions_prefix(regions, clean_redis, settings):
    us = get_launcher(regions["us-east"])
    eu = get_launcher(regions["eu-west"])
    generation = us.set_traffic([])
    assert published(clean_redis, regions["us-east"].gateway_prefix) == (generation, [])
    assert published(clean_redis, regions["eu-west"].gateway_prefix) is None
    assert published(clean_redis, settings.GATEWAY_REDIS_PREFIX) is None
    assert us.traffic_applied(generation)  # no gateway of us-east live: nothing routes
    eu.set_traffic([])
    assert published(clean_redis, regions["eu-west"].gateway_prefix) is not None


def test_a_region_naming_an_unknown_context_fails_instead_of_using_another_cluster(
    regions, clusters
):
    lost = Region.objects.create(
        name="ap-south", launcher="kubernetes", kubernetes_context="ap-south"
    )
    with pytest.raises(ConfigException, match="ap-south"):
        get_launcher(lost)
    assert all(not fake.requests for fake in clusters.values())


def test_a_region_with_no_context_keeps_an_explicit_client(db, settings, clean_redis):
    settings.KUBERNETES_NAMESPACE = "llm-serving"
    plain = Region.objects.create(name="plain", launcher="kubernetes")
    fake = FakeKubeApi()
    try:
        configuration = k8s.Configuration()
        configuration.host = fake.url
        launcher = KubernetesLauncher(region_config(plain), api_client=k8s.ApiClient(configuration))
        assert launcher.namespace == "llm-serving"  # blank: the platform's namespace
        assert launcher.platform_gateway.prefix == f"{settings.GATEWAY_REDIS_PREFIX}.plain"
        generation = launcher.set_traffic([])
        assert published(clean_redis, plain.gateway_prefix) == (generation, [])
        assert all("/namespaces/llm-serving/" in p for _, p in fake.requests)
    finally:
        fake.close()
