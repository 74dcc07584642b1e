"""The deployment page's charts in a real browser (Debian's chromium driven by Playwright).

Light on purpose: no instance runs. The deployment, its v1 and v2 instances and their metric
points are rows written here, as the scrape task writes them, so the page's script (uPlot
over the metrics API) has a rollout to draw: a canary's lines next to the old version's, and
the marks of the deploy and of a stage change.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.core.actors import CONTROLLER
from portal.deployments.lifecycle import record_event
from portal.deployments.models import EventKind, Instance, InstanceState, ObservedState
from portal.metrics import buckets as bk
from portal.metrics.models import MetricPoint
from tests.factories import make_version
from tests.web.test_browser import browser_page, shot, sign_in  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


#: Each version's end-to-end latency over a pass, as the scraper keeps it (cumulative bucket
#: deltas): v1 answers within 25 ms, the canary within 50 ms.
E2E = {
    1: {0.01: 0.0, 0.025: 4.0, 0.05: 4.0, "+Inf": 4.0},
    2: {0.01: 0.0, 0.025: 0.0, 0.05: 4.0, "+Inf": 4.0},
}


def _buckets(number: int) -> bk.Buckets:
    return {float(b): n for b, n in E2E[number].items()}


def _point(deployment, at, rates: dict[int, float]) -> None:
    """One scrape pass's point: requests/s per version, and their sum."""
    versions = {
        str(n): {
            "requests_per_s": rps,
            "errors_per_s": 0.0,
            "prompt_tokens_per_s": rps * 20,
            "generation_tokens_per_s": rps * 8,
            "sources_up": 1,
            "sources_down": 0,
            "e2e_buckets": bk.to_json(_buckets(n)),
        }
        for n, rps in rates.items()
    }
    MetricPoint.objects.create(
        deployment=deployment,
        at=at,
        requests_per_s=sum(rates.values()),
        errors_per_s=0.0,
        sources_up=len(rates),
        e2e_buckets=bk.to_json(bk.merge(_buckets(n) for n in rates)),
        versions=versions,
    )


@pytest.fixture
def rollout(deployment, artifact_root):
    """v1 served alone for 20 minutes, then v2 took 10% at a stage change 8 minutes ago."""
    v1 = deployment.target_version
    v2 = make_version(deployment.model, artifact_root)
    deployment.observed_state = ObservedState.PROGRESSING
    deployment.save(update_fields=["observed_state"])
    for name, version in (("ranker-v1-a", v1), ("ranker-v2-a", v2)):
        Instance.objects.create(
            deployment=deployment, version=version, name=name, state=InstanceState.READY
        )
    now = timezone.now()
    for i in range(80):  # every 15 s over the last 20 minutes
        at = now - timedelta(seconds=15 * (80 - i))
        if at < now - timedelta(minutes=8):
            _point(deployment, at, {v1.number: 4.0})
        else:
            _point(deployment, at, {v1.number: 3.6, v2.number: 0.4})
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.STATE,
        message=f"Stage 1 of 3: traffic v{v2.number} 10% · v{v1.number} 90%.",
        data={"traffic": {str(v2.number): 10, str(v1.number): 90}, "retiring": []},
    )
    # The timeline's rows are stamped now; put the stage change where the canary began.
    deployment.events.filter(message__startswith="Stage 1 of 3").update(
        created_at=now - timedelta(minutes=8)
    )
    return deployment, v1.number, v2.number


def test_charts_draw_zoom_hover_and_mark_the_rollout(
    live_server,
    member,
    team,
    rollout,
    browser_page,  # noqa: F811
):
    deployment, v1, v2 = rollout
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + reverse("web:deployment_detail", args=[team.slug, deployment.pk]))

    # A chart drawn by uPlot, split by version because the window holds v1 and v2.
    requests = page.locator("[data-chart=requests]")
    requests.locator("canvas").wait_for()
    assert float(requests.get_attribute("data-peak")) == pytest.approx(4.0)
    assert requests.get_attribute("data-series") == (
        f"v{v2} requests|v{v1} requests|v{v2} errors|v{v1} errors"
    )
    panel = page.get_by_test_id("charts")
    assert panel.get_attribute("data-versions") == f"{v2},{v1}"
    assert page.get_by_test_id("metrics-empty").is_hidden()

    # The stage change and the deploy (this row's creation, just now) are listed under the
    # charts, oldest first.
    markers = page.get_by_test_id("chart-markers").locator("li")
    assert [m.get_attribute("data-kind") for m in markers.all()] == ["stage", "deploy"]
    assert "Stage 1 of 3" in markers.nth(0).inner_text()

    # The latency chart reads in ms.
    e2e = page.locator("[data-chart=e2e]")
    assert "(ms)" in e2e.locator("figcaption").inner_text()
    canary_p99 = bk.quantile(_buckets(2), 0.99)
    assert canary_p99 is not None
    assert float(e2e.get_attribute("data-peak")) == pytest.approx(canary_p99 * 1000)

    # The stage change is drawn as a vertical line on the charts (the deploy is later than
    # the last point, so it is listed but off the x axis).
    assert "stage" in requests.get_attribute("data-marks").split(",")

    # The x axis spans the data, not the window: over 24 h it starts at the first point's bin
    # (20 minutes ago), and over 15 minutes at the first point of those 15 minutes.
    stamps = [p.timestamp() for p in MetricPoint.objects.values_list("at", flat=True)]
    first, last = min(stamps), max(stamps)
    x_span = "() => { const x = document.querySelector('[data-chart=requests]').portalPlot.scales.x; return [x.min, x.max]; }"
    for label, key in (("24 h", "24h"), ("15 min", "15m")):
        clicked = timezone.now().timestamp()
        with page.expect_response(lambda r, key=key: f"range={key}" in r.url and r.status == 200):
            page.get_by_role("button", name=label).click()
        page.wait_for_function(
            f"document.querySelector('[data-testid=charts]').dataset.range === {key!r}"
        )
        assert page.get_by_role("button", name=label).get_attribute("aria-pressed") == "true"
        low, high = page.evaluate(x_span)
        assert last - 120 <= high <= last
        if key == "24h":  # two-minute bins (see bin_seconds), stamped with their start
            assert first - 120 <= low <= first
        else:
            assert clicked - 15 * 60 - 1 <= low <= clicked - 15 * 60 + 16

    # At rest the legend reads each series' latest value, not a bare dash.
    values = requests.locator(".u-legend .u-series .u-value")
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-chart=requests] .u-legend .u-value')]"
        ".some(v => v.textContent.includes('latest'))"
    )
    resting = values.all_inner_texts()
    assert "3.6 req/s, latest" in resting and "0.4 req/s, latest" in resting, resting
    assert "—" not in "".join(resting)
    assert "hover to read a moment" in requests.locator(".u-legend").inner_text()

    # Hovering the requests chart shows each series' value there in the legend.
    over = requests.locator(".u-over")
    box = over.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-chart=requests] .u-legend .u-value')]"
        ".every(v => !v.textContent.includes('latest'))"
    )
    texts = values.all_inner_texts()
    assert "3.6 req/s" in texts and "0.4 req/s" in texts, texts
    shot(page, "charts-rollout-hover")

    # On a phone the charts shrink to the screen instead of pushing the page sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(
        "() => { const c = document.querySelector('[data-chart=requests] canvas');"
        " return c && c.getBoundingClientRect().right <= 390; }"
    )
    assert page.evaluate(
        "() => { const p = document.querySelector('[data-testid=charts]');"
        " return p.scrollWidth <= p.clientWidth; }"
    )
    shot(page, "charts-390")
