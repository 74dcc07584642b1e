"""``GET /api/v1/deployments/{id}/metrics/`` and ``GET /api/v1/models/{id}/metrics/``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.metrics.services import CHARTS, scrape_live_instances
from tests.api.helpers import api_error, ok
from tests.factories import make_deployment, make_model, make_version
from tests.metrics.helpers import Answer, EngineExposition, add_instance, loopback_source

pytestmark = pytest.mark.django_db


@pytest.fixture
def scraped(deployment):
    """Two passes over one source, the second 10 s after the first, ending a minute ago."""
    engine = EngineExposition()
    start = timezone.now() - timedelta(seconds=70)
    with loopback_source(Answer(body=engine.text())) as source:
        add_instance(deployment, "api-1", source.url)
        scrape_live_instances(now=start)
        engine.serve(ok=20)
        source.answer = Answer(body=engine.text())
        scrape_live_instances(now=start + timedelta(seconds=10))
    return deployment, source.url


def test_a_deployments_metrics(api, member, scraped):
    deployment, url = scraped
    body = ok(api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/?minutes=5"))
    assert set(body) == {
        "since",
        "until",
        "step",
        "points",
        "versions",
        "markers",
        "sources",
        "charts",
    }
    first, last = body["points"]
    assert first["requests_per_s"] is None and last["requests_per_s"] == pytest.approx(2.0)
    assert last["ttft_p50"] > 0 and last["sources_up"] == 1
    assert body["sources"] == [
        {
            "instance": "api-1",
            "version": deployment.target_version.number,
            "url": url,
            "up": True,
            "error": "",
            "last_scraped_at": body["sources"][0]["last_scraped_at"],
        }
    ]
    assert [chart["key"] for chart in body["charts"]] == [chart.key for chart in CHARTS]
    assert body["charts"][0]["lines"][0] == {"field": "prompt_tokens_per_s", "label": "prompt"}


def test_the_window_is_in_minutes(api, member, scraped):
    deployment, _ = scraped
    assert (
        ok(api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/?minutes=1"))["points"]
        == []
    )
    assert len(ok(api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/"))["points"]) == 2
    for bad in ("0", "1441", "soon"):
        response = api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/?minutes={bad}")
        assert "minutes" in api_error(response, 400, "invalid")["fields"]


def test_a_models_metrics_merge_its_deployments(
    api, viewer_token, scraped, model, artifact_root, cpu_instance_type
):
    versioned = make_deployment(
        model, make_version(model, artifact_root), cpu_instance_type, strategy="versioned"
    )
    engine = EngineExposition()
    with loopback_source(Answer(body=engine.text())) as source:
        add_instance(versioned, "api-2", source.url)
        scrape_live_instances()
    body = ok(api(viewer_token).get(f"/api/v1/models/{model.pk}/metrics/"))
    assert len(body["points"]) == 3
    assert {s["instance"] for s in body["sources"]} == {"api-1", "api-2"}
    last = body["points"][-1]
    assert (last["sources_up"], last["sources_down"]) == (1, 1)  # api-1's server is gone
    assert {s["instance"]: s["up"] for s in body["sources"]} == {"api-1": False, "api-2": True}


def test_another_teams_metrics_do_not_exist(api, outsider, scraped, other_team, release):
    deployment, _ = scraped
    api_error(api(outsider).get(f"/api/v1/deployments/{deployment.pk}/metrics/"), 404, "not_found")
    api_error(api(outsider).get(f"/api/v1/models/{deployment.model_id}/metrics/"), 404, "not_found")
    api_error(api().get(f"/api/v1/deployments/{deployment.pk}/metrics/"), 401, "not_authenticated")


def test_a_model_without_deployments_has_no_points(api, member, team):
    body = ok(api(member).get(f"/api/v1/models/{make_model(team, 'idle').pk}/metrics/"))
    assert body["points"] == [] and body["sources"] == []
