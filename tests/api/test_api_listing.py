"""Pagination and filtering of the API's lists."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import DeploymentEvent, Instance, ObservedState
from portal.registry.lifecycle import transition_version
from portal.registry.models import Model
from portal.registry.models import VersionState as V
from tests.factories import make_deployment, make_model, make_version

pytestmark = pytest.mark.django_db

API = "/api/v1"


@pytest.fixture
def client(api, member_token):
    return api(member_token)


def get(client, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200, response.content
    return response.json()


# --- Pagination -------------------------------------------------------------------------------


def test_pages_follow_next_links(client, team):
    Model.objects.bulk_create(Model(team=team, slug=f"m{i}", task="chat") for i in range(5))
    page = get(client, f"{API}/models/?page_size=2")
    assert (page["count"], page["previous"], len(page["results"])) == (5, None, 2)
    slugs = []
    while True:
        slugs += [m["slug"] for m in page["results"]]
        if page["next"] is None:
            break
        assert "page_size=2" in page["next"]
        page = get(client, page["next"])
        assert page["previous"] is not None
    assert slugs == ["m0", "m1", "m2", "m3", "m4"]


def test_page_size_default_and_maximum(client, team):
    Model.objects.bulk_create(Model(team=team, slug=f"m{i:03}", task="chat") for i in range(205))
    default = get(client, f"{API}/models/")
    assert (default["count"], len(default["results"])) == (205, 50)
    capped = get(client, f"{API}/models/?page_size=1000")
    assert (len(capped["results"]), capped["results"][-1]["slug"]) == (200, "m199")
    assert "page=2" in capped["next"]
    last = get(client, capped["next"])
    assert [m["slug"] for m in last["results"]] == ["m200", "m201", "m202", "m203", "m204"]
    assert last["next"] is None


def test_page_past_the_end_is_not_found(client, team):
    response = client.get(f"{API}/models/?page=9")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("query", ["page=", "page_size="])
def test_a_page_parameter_left_blank_is_a_400(client, team, query):
    response = client.get(f"{API}/models/?{query}")
    assert response.status_code == 400
    assert query.rstrip("=") in response.json()["error"]["fields"]


def test_counts_only_the_callers_objects(client, team, other_team):
    Model.objects.bulk_create(Model(team=other_team, slug=f"m{i}", task="chat") for i in range(3))
    Model.objects.create(team=team, slug="mine", task="chat")
    page = get(client, f"{API}/models/")
    assert (page["count"], [m["slug"] for m in page["results"]]) == (1, ["mine"])


# --- Filtering --------------------------------------------------------------------------------


@pytest.fixture
def catalog(team, release, cpu_instance_type, artifact_root):
    """Two models; ranker has v1 (ready, Versioned, serving) and v2 (registered, Red-Black)."""
    ranker = make_model(team, "ranker", task="chat")
    embedder = make_model(team, "embedder", task="embedding")
    v1, v2 = make_version(ranker, artifact_root), make_version(ranker, artifact_root)
    e1 = make_version(embedder, artifact_root)
    for state in (V.MATERIALIZING, V.MATERIALIZED, V.PACKAGING, V.READY):
        transition_version(v1, state)
    versioned = make_deployment(ranker, v1, cpu_instance_type, strategy="versioned")
    transition_deployment(versioned, ObservedState.PROGRESSING, reason="rolling")
    transition_deployment(versioned, ObservedState.SERVING, reason="done")
    red_black = make_deployment(ranker, v2, cpu_instance_type)
    embedding = make_deployment(embedder, e1, cpu_instance_type)
    return SimpleNamespace(
        ranker=ranker,
        embedder=embedder,
        v1=v1,
        v2=v2,
        e1=e1,
        versioned=versioned,
        red_black=red_black,
        embedding=embedding,
        pods=[
            Instance.objects.create(deployment=versioned, version=v1, name="pod-a"),
            Instance.objects.create(deployment=versioned, version=v1, name="pod-b"),
            Instance.objects.create(deployment=red_black, version=v2, name="pod-c"),
        ],
    )


def ids(client, url: str) -> list:
    return [item["id"] for item in get(client, url)["results"]]


def test_model_filters(client, catalog, other_team):
    make_model(other_team, "ranker")
    c = catalog
    assert ids(client, f"{API}/models/?team=search") == [c.embedder.pk, c.ranker.pk]
    assert ids(client, f"{API}/models/?team=ads") == []  # not the caller's team
    assert ids(client, f"{API}/models/?slug=ranker") == [c.ranker.pk]
    assert ids(client, f"{API}/models/?task=embedding") == [c.embedder.pk]
    assert ids(client, f"{API}/models/?task=chat&slug=embedder") == []
    assert ids(client, f"{API}/models/?ordering=-slug") == [c.ranker.pk, c.embedder.pk]


def test_version_filters(client, catalog):
    c = catalog
    assert set(ids(client, f"{API}/versions/?model={c.ranker.pk}")) == {c.v1.pk, c.v2.pk}
    assert ids(client, f"{API}/versions/?state=ready") == [c.v1.pk]
    assert set(ids(client, f"{API}/versions/?state=registered")) == {c.v2.pk, c.e1.pk}
    assert ids(client, f"{API}/versions/?model={c.ranker.pk}&state=registered") == [c.v2.pk]
    assert ids(client, f"{API}/versions/?model={c.embedder.pk}&number=1") == [c.e1.pk]


def test_deployment_filters(client, catalog):
    c = catalog
    by_model = ids(client, f"{API}/deployments/?model={c.ranker.pk}")
    assert set(by_model) == {c.versioned.pk, c.red_black.pk}
    assert ids(client, f"{API}/deployments/?strategy=versioned") == [c.versioned.pk]
    assert ids(client, f"{API}/deployments/?observed_state=serving") == [c.versioned.pk]
    assert set(ids(client, f"{API}/deployments/?observed_state=pending")) == {
        c.red_black.pk,
        c.embedding.pk,
    }
    assert ids(client, f"{API}/deployments/?model={c.embedder.pk}&strategy=red_black") == [
        c.embedding.pk
    ]


def test_event_filters_follow_a_timeline(client, catalog):
    c = catalog
    timeline = list(
        DeploymentEvent.objects.filter(deployment=c.versioned)
        .order_by("id")
        .values_list("id", flat=True)
    )
    assert len(timeline) == 3  # created, progressing, serving
    assert ids(client, f"{API}/events/?deployment={c.versioned.pk}") == timeline
    assert (
        ids(client, f"{API}/events/?deployment={c.versioned.pk}&after_id={timeline[0]}")
        == timeline[1:]
    )
    assert ids(client, f"{API}/events/?deployment={c.versioned.pk}&after_id={timeline[-1]}") == []
    states = get(client, f"{API}/events/?deployment={c.versioned.pk}&kind=state")["results"]
    assert [e["to_state"] for e in states] == ["progressing", "serving"]


def test_instance_filters(client, catalog):
    c = catalog
    a, b, pod_c = c.pods
    assert ids(client, f"{API}/instances/?deployment={c.versioned.pk}") == [a.pk, b.pk]
    assert ids(client, f"{API}/instances/?deployment={c.red_black.pk}") == [pod_c.pk]
    assert ids(client, f"{API}/instances/?deployment={c.embedding.pk}") == []
    assert ids(client, f"{API}/instances/?state=pending") == [a.pk, b.pk, pod_c.pk]


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("versions/?state=bogus", "state"),
        ("deployments/?strategy=blue_green", "strategy"),
        ("events/?after_id=abc", "after_id"),
        ("models/?task=poem", "task"),
    ],
)
def test_invalid_filter_values_are_400(client, team, url, field):
    response = client.get(f"{API}/{url}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [field]


def test_release_filter(client, release):
    assert [r["name"] for r in get(client, f"{API}/releases/?is_default=true")["results"]] == [
        release.name
    ]
    assert get(client, f"{API}/releases/?is_default=false")["results"] == []
