"""The deployment page's scaling panel: the policy in words, the count now, asleep and waking,
the last cold start, and the last decisions with the reasons the controller gave."""

from __future__ import annotations

import html
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.deployments.lifecycle import CONTROLLER, record_event
from portal.deployments.models import Deployment, EventKind, Instance, InstanceState, ObservedState
from portal.deployments.state import autoscaling
from portal.deployments.state.autoscaling import InstanceLoad, ScalingPolicy, ScalingState
from portal.metrics.models import MetricPoint
from tests.web.test_browser import browser_page, shot, sign_in  # noqa: F401  (a fixture)
from tests.web.test_pages import page_html, signed_in

pytestmark = pytest.mark.django_db

#: The multiplication sign the decisions' reasons write.
X = "\u00d7"


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _panel(member, team, deployment) -> str:
    page = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    found = re.search(r'<section class="scaling" data-testid="scaling".*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _testid(panel: str, testid: str) -> str:
    found = re.search(rf'<(\w+)[^>]*data-testid="{testid}"[^>]*>(.*?)</\1>', panel, re.S)
    assert found, (testid, panel)
    return _text(found.group(2))


def _set(deployment: Deployment, **fields) -> Deployment:
    Deployment.objects.filter(pk=deployment.pk).update(**fields)
    deployment.refresh_from_db()
    return deployment


def _autoscaled(deployment: Deployment, **more) -> Deployment:
    fields = {
        "observed_state": ObservedState.SERVING,
        "replicas": 2,
        "min_replicas": 1,
        "max_replicas": 4,
        "scale_metric": autoscaling.ScaleMetric.IN_FLIGHT,
        "scale_target": 4.0,
        "scale_up_window_seconds": 10,
        "scale_down_window_seconds": 300,
    }
    return _set(deployment, **{**fields, **more})


def test_a_fixed_count_reads_fixed_and_has_no_decisions(member, team, deployment):
    _set(deployment, replicas=2, min_replicas=2, max_replicas=2)
    Instance.objects.create(
        deployment=deployment, version=deployment.target_version, name="r-1", state="ready"
    )
    panel = _panel(member, team, deployment)
    assert _testid(panel, "scaling-policy") == "Scaling: fixed 2 replicas"
    assert _testid(panel, "scaling-now") == "2 wanted · 1 ready"
    assert _testid(panel, "scaling-no-decisions") == "None: the count is fixed."
    assert "cold-start" not in panel and "scaling-asleep" not in panel


def test_the_policy_in_words_and_the_decisions_newest_first_with_their_reasons(
    member, team, deployment
):
    deployment = _autoscaled(deployment, scale_to_zero_after_seconds=600)
    policy = ScalingPolicy.of(deployment)
    # Two real decisions: load of 16 in flight on two instances asks for 4, then 1.5 on four
    # (after the down window) asks for 2. Each is recorded as the controller records it.
    state, current, now = ScalingState(), 2, time.time() - 1000
    for loads, at in (
        ([InstanceLoad(6, 2, None), InstanceLoad(7, 1, None)], now),
        ([InstanceLoad(1, 0.5, None)] * 4, now + 400),
    ):
        current, state, decision = autoscaling.decide(policy, state, current, loads, at)
        assert decision is not None
        record_event(
            deployment,
            actor=CONTROLLER,
            kind=EventKind.SCALING,
            message=f"Scaled {decision.replicas_from} → {decision.replicas_to}: {decision.reason}.",
            data=decision.to_json(),
        )
    deployment = _set(deployment, replicas=current, scaling=state)

    panel = _panel(member, team, deployment)
    assert _testid(panel, "scaling-policy") == (
        "Scaling: 1-4 replicas on in-flight requests per instance, target 4; up window 10 s, "
        "down 300 s; scale to zero after 600 s idle"
    )
    assert _testid(panel, "scaling-now") == "2 wanted · 0 ready"
    rows = [
        _text(li)
        for li in re.findall(r"<li[^>]*>(.*?)</li>", _testid_html(panel, "scaling-decisions"), re.S)
    ]
    assert len(rows) == 2  # the state's decisions and their events, each once
    newest, oldest = rows
    down_at = datetime.fromtimestamp(now + 400, tz=UTC)
    assert newest.startswith(timezone.localtime(down_at).strftime("%b %-d, %H:%M:%S") + " 4 → 2 ")
    assert "in-flight requests per instance 1.5 against a target of 4" in newest
    assert f"ceil(4 {X} 1.5 / 4) = 2" in newest
    assert " 2 → 4 " in oldest and "in-flight requests per instance 8 against a target of 4" in (
        oldest
    )
    assert f"ceil(2 {X} 8 / 4) = 4" in oldest


def test_decisions_kept_only_in_the_state_are_listed_too_at_most_ten(member, team, deployment):
    deployment = _autoscaled(deployment)
    start = time.time() - 3600
    decisions = tuple(
        autoscaling.Decision(
            at=start + 60 * i,
            replicas_from=1 + i % 2,
            replicas_to=2 - i % 2,
            metric="in_flight",
            observed=5.0,
            target=4.0,
            reporting=1,
            recommended=2 - i % 2,
            reason=f"reason number {i}",
        )
        for i in range(12)
    )
    deployment = _set(deployment, scaling=ScalingState(decisions=decisions))
    panel = _panel(member, team, deployment)
    reasons = re.findall(r"reason number (\d+)", panel)
    assert reasons == [str(i) for i in range(11, 1, -1)]  # newest first, ten of them


def test_asleep_says_since_when_and_what_wakes_it(member, team, deployment):
    asleep_since = time.time() - 120
    deployment = _autoscaled(
        deployment,
        scale_to_zero_after_seconds=600,
        scaling=ScalingState(asleep_since=asleep_since, cold_start_seconds=12.34),
    )
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.SCALING,
        message="Scaled to zero: no request for 10 min (the policy's 600 s); the gateway holds "
        "the next request and starts an instance.",
        data={"asleep": True, "idle_seconds": 600, "retiring": ["r-1", "r-2"]},
    )
    panel = _panel(member, team, deployment)
    hhmm = timezone.localtime(datetime.fromtimestamp(asleep_since, tz=UTC)).strftime("%H:%M")
    assert _testid(panel, "scaling-asleep") == (
        f"Asleep (scaled to zero) since {hhmm} — the next request starts an instance."
    )
    assert _testid(panel, "scaling-now") == "0 (asleep) · 0 ready"
    assert _testid(panel, "cold-start").startswith("Last cold start: 12.3 s")
    assert "data-asleep" in panel and "scaling-waking" not in panel
    rows = re.findall(r"<li[^>]*>(.*?)</li>", _testid_html(panel, "scaling-decisions"), re.S)
    assert len(rows) == 1
    assert " 2 → 0 Scaled to zero: no request for 10 min" in _text(rows[0])


def test_waking_while_the_first_instance_starts_then_the_cold_start(member, team, deployment):
    deployment = _autoscaled(
        deployment,
        scale_to_zero_after_seconds=600,
        replicas=1,
        scaling=ScalingState(woken_at=time.time() - 3),
    )
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.SCALING,
        message="Waking after 12 min asleep: a request is held at the gateway; starting 1 "
        "instance(s).",
        data={"woken": True, "replicas": 1},
    )
    panel = _panel(member, team, deployment)
    assert _testid(panel, "scaling-waking").startswith("Waking…")
    assert "scaling-asleep" not in panel and "cold-start" not in panel
    assert "0 → 1 Waking after 12 min asleep" in _text(_testid_html(panel, "scaling-decisions"))

    # The controller measured the cold start: the live part (which the page polls) says so.
    deployment = _set(deployment, scaling=ScalingState(cold_start_seconds=41.06))
    Instance.objects.create(
        deployment=deployment,
        version=deployment.target_version,
        name="r-1",
        state=InstanceState.READY,
    )
    live = signed_in(member).get(reverse("web:deployment_live", args=[team.slug, deployment.pk]))
    assert live.status_code == 200
    body = live.content.decode()
    assert "scaling-waking" not in body
    assert _testid(body, "cold-start").startswith("Last cold start: 41.1 s")
    assert _testid(body, "scaling-now") == "1 wanted · 1 ready"


def _testid_html(panel: str, testid: str) -> str:
    found = re.search(rf'<(\w+)[^>]*data-testid="{testid}"[^>]*>(.*?)</\1>', panel, re.S)
    assert found, (testid, panel)
    return found.group(2)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_in_a_browser_the_replicas_chart_beside_requests_and_the_panel_fits_a_phone(
    live_server,
    member,
    team,
    deployment,
    browser_page,  # noqa: F811
):
    """Twenty minutes of passes as the scrape task writes them (2 → 4 → 2 instances, then
    asleep at 0), drawn next to the requests; the panel with long reasons fits 390 px."""
    asleep_since = time.time() - 120
    now = timezone.now()
    for i in range(80):
        age = 15 * (80 - i)
        ready = 0 if age <= 120 else (2 if age > 900 else (4 if age > 480 else 2))
        MetricPoint.objects.create(
            deployment=deployment,
            at=now - timedelta(seconds=age),
            requests_per_s=0.0 if ready == 0 else ready * 3.5,
            errors_per_s=0.0,
            sources_up=ready,
            ready_instances=ready,
            wanted_replicas=ready,
        )
    decisions = tuple(
        autoscaling.Decision(
            at=time.time() - age,
            replicas_from=before,
            replicas_to=after,
            metric="in_flight",
            observed=load,
            target=4.0,
            reporting=before,
            recommended=after,
            reason=f"in-flight requests per instance {load:g} against a target of 4 "
            f"(ceil({before} {X} {load:g} / 4) = {after}); "
            f"the highest of the last 300 s is {after}",
        )
        for age, before, after, load in ((900, 2, 4, 7.5), (480, 4, 2, 1.8))
    )
    _autoscaled(
        deployment,
        scale_to_zero_after_seconds=600,
        scaling=ScalingState(
            asleep_since=asleep_since, cold_start_seconds=12.3, decisions=decisions
        ),
    )
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + reverse("web:deployment_detail", args=[team.slug, deployment.pk]))

    replicas = page.locator("[data-chart=replicas]")
    replicas.locator("canvas").wait_for()
    assert replicas.get_attribute("data-series") == "ready|wanted"
    assert float(replicas.get_attribute("data-peak")) == pytest.approx(4.0)
    assert "(instances)" in replicas.locator("figcaption").inner_text()
    legend = replicas.locator(".u-legend").inner_text()
    assert "0 instances, latest" in legend
    # Beside the requests chart: the next figure, on the same row at a desktop's width.
    requests = page.locator("[data-chart=requests]")
    assert (
        page.evaluate(
            "() => document.querySelector('[data-chart=requests]').nextElementSibling.dataset.chart"
        )
        == "replicas"
    )
    assert requests.bounding_box()["y"] == pytest.approx(replicas.bounding_box()["y"], abs=1)
    assert page.get_by_test_id("scaling-asleep").is_visible()
    shot(page, "30-scaling-desktop")

    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(500)
    shot(page, "31-scaling-phone")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
