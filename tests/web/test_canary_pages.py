"""Canary analysis on the pages: the deploy form's checkbox and policy (the services' refusals
by field, a live deployment's settings offered as they are), and the deployment page's panel of
judged bakes and the windows its charts shade.

The analyses shown are made by the judge itself (:func:`portal.deployments.rollout.judge.judge`)
from seeded samples and stored as the controller stores them, so the page is tested on the
numbers a bake really produces."""

from __future__ import annotations

import html as html_lib
import json
import re
from datetime import timedelta

import numpy as np
import pytest
from django.urls import reverse
from django.utils import timezone

from portal.deployments.models import Deployment, ObservedState, StageAnalysis
from portal.deployments.rollout.judge import CanaryPolicy, Observations, judge
from portal.web import canary
from tests.factories import make_deployment, make_version
from tests.web.test_browser import browser_page, shot, sign_in  # noqa: F401  (a fixture)
from tests.web.test_charts_browser import rollout  # noqa: F401  (a fixture)
from tests.web.test_pages import errors_of, page_html, signed_in

pytestmark = pytest.mark.django_db

#: Three metrics, each judged on 400 requests a side.
POLICY = {
    "metrics": [
        {"name": "latency_s", "min_samples": 300},
        {"name": "completion_tokens", "min_samples": 300},
        {"name": "error_rate", "min_samples": 300},
    ]
}


def field_errors(response, name: str) -> str:
    """The text of the inline errors of the form field ``name``."""
    found = re.search(
        rf'<ul class="errors" id="id_{name}_errors"[^>]*>(.*?)</ul>',
        response.content.decode(),
        re.S,
    )
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", found.group(1))) if found else ""


def textarea(html: str, name: str) -> str:
    found = re.search(rf'<textarea name="{name}"[^>]*>(.*?)</textarea>', html, re.S)
    assert found, name
    return html_lib.unescape(found.group(1)).strip()


# --- the deploy form ----------------------------------------------------------------------------


def test_the_form_offers_canary_analysis_with_the_default_policy_as_placeholder(
    member, deploy_url, version
):
    html = signed_in(member).get(deploy_url).content.decode()
    assert "Judge each bake against the old version (canary analysis)" in html
    checkbox = re.search(r'<input type="checkbox" name="canary_analysis"[^>]*>', html)
    assert checkbox and "checked" not in checkbox[0]
    placeholder = html_lib.unescape(
        re.search(r'<textarea name="canary_policy"[^>]*placeholder="([^"]*)"', html, re.S)[1]
    )
    assert json.loads(placeholder) == CanaryPolicy.default().to_dict()
    assert textarea(html, "canary_policy") == ""


def test_the_form_deploys_with_canary_analysis_and_a_policy(member, deploy_url, deploy_fields):
    custom = {"metrics": [{"name": "latency_s", "max_change": 0.2}], "pass_score": 90}
    response = signed_in(member).post(
        deploy_url, {**deploy_fields, "canary_analysis": "on", "canary_policy": json.dumps(custom)}
    )
    assert response.status_code == 302, errors_of(response)
    deployment = Deployment.objects.get()
    assert deployment.canary_analysis is True
    # Stored whole: what was left out is the default's.
    assert deployment.canary_policy == CanaryPolicy.from_dict(custom).to_dict()
    [latency] = deployment.canary_policy["metrics"]
    assert (latency["max_change"], latency["critical"]) == (0.2, True)
    assert deployment.canary_policy["pass_score"] == 90


def test_an_empty_policy_is_the_platform_default(member, deploy_url, deploy_fields):
    response = signed_in(member).post(deploy_url, {**deploy_fields, "canary_analysis": "on"})
    assert response.status_code == 302, errors_of(response)
    deployment = Deployment.objects.get()
    assert deployment.canary_analysis is True
    assert deployment.canary_policy == CanaryPolicy.default().to_dict()


def test_a_bad_policy_is_an_error_on_its_field_naming_the_part(member, deploy_url, deploy_fields):
    bad = {"metrics": [{"name": "latency_s", "alpha": 2}]}
    response = signed_in(member).post(
        deploy_url, {**deploy_fields, "canary_analysis": "on", "canary_policy": json.dumps(bad)}
    )
    assert response.status_code == 200
    message = field_errors(response, "canary_policy")
    assert "metrics[0].alpha" in message and "(0, 0.5)" in message, errors_of(response)
    assert not Deployment.objects.exists()
    # What was typed is sent back to be fixed, not replaced.
    assert json.loads(textarea(response.content.decode(), "canary_policy")) == bad


def test_invalid_json_is_an_error_on_the_policy_field(member, deploy_url, deploy_fields):
    response = signed_in(member).post(
        deploy_url, {**deploy_fields, "canary_analysis": "on", "canary_policy": '{"metrics": ['}
    )
    assert "Not valid JSON" in field_errors(response, "canary_policy"), errors_of(response)
    response = signed_in(member).post(deploy_url, {**deploy_fields, "canary_policy": "[1, 2]"})
    assert "Must be a JSON object" in field_errors(response, "canary_policy")
    assert not Deployment.objects.exists()


def test_canary_analysis_needs_a_red_black_stage_below_100(member, deploy_url, deploy_fields):
    client = signed_in(member)
    response = client.post(deploy_url, {**deploy_fields, "canary_analysis": "on", "stages": "100"})
    assert "stage below 100%" in field_errors(response, "canary_analysis"), errors_of(response)
    response = client.post(
        deploy_url, {**deploy_fields, "canary_analysis": "on", "strategy": "versioned"}
    )
    assert "Only a Red-Black rollout" in field_errors(response, "canary_analysis")
    assert not Deployment.objects.exists()


def test_rolling_the_live_deployment_offers_its_canary_settings(
    member, deploy_url, model, version, cpu_instance_type, artifact_root
):
    custom = {"metrics": [{"name": "error_rate", "max_change": 0.03}]}
    live = make_deployment(
        model, version, cpu_instance_type, canary_analysis=True, canary_policy=custom
    )
    Deployment.objects.filter(pk=live.pk).update(observed_state=ObservedState.SERVING)
    v2 = make_version(model, artifact_root)
    client = signed_in(member)
    html = client.get(deploy_url + f"?version={v2.number}").content.decode()
    assert re.search(r'<input type="checkbox" name="canary_analysis"[^>]*checked', html)
    offered = textarea(html, "canary_policy")
    assert json.loads(offered) == CanaryPolicy.from_dict(custom).to_dict()
    assert offered.count("\n") == 2  # one metric a line, not one field a line
    # Posted back as offered, the rollout keeps them.
    live.refresh_from_db()
    response = client.post(
        deploy_url,
        {
            "version": v2.pk,
            "strategy": "red_black",
            "replicas": live.replicas,
            "instance_type": cpu_instance_type.pk,
            "stages": ", ".join(str(s) for s in live.stages),
            "bake_seconds": live.bake_seconds,
            "health_deadline_seconds": live.health_deadline_seconds,
            "max_error_rate": live.max_error_rate,
            "canary_analysis": "on",
            "canary_policy": offered,
        },
    )
    assert response["Location"].endswith(f"/deployments/{live.pk}/"), errors_of(response)
    live.refresh_from_db()
    assert live.target_version == v2
    assert (live.canary_analysis, live.canary_policy) == (
        True,
        CanaryPolicy.from_dict(custom).to_dict(),
    )


def test_a_live_deployment_on_the_default_policy_offers_an_empty_box(
    member, deploy_url, model, version, cpu_instance_type
):
    live = make_deployment(model, version, cpu_instance_type, canary_analysis=True)
    Deployment.objects.filter(pk=live.pk).update(observed_state=ObservedState.SERVING)
    html = signed_in(member).get(deploy_url).content.decode()
    assert textarea(html, "canary_policy") == ""


# --- the deployment page ------------------------------------------------------------------------


def judged(deployment: Deployment, canary_slowdown: float, **fields) -> StageAnalysis:
    """Judge a bake of seeded samples (400 requests a side, the new version's latency
    multiplied by ``canary_slowdown``) and store it as the controller does."""
    rng = np.random.default_rng(7)
    policy = CanaryPolicy.from_dict(POLICY)

    def side(slowdown: float, errors: int) -> Observations:
        return Observations(
            samples={
                "latency_s": list(rng.lognormal(np.log(0.08 * slowdown), 0.3, 400)),
                "completion_tokens": list(rng.normal(200, 20, 400)),
            },
            counts={"error_rate": (errors, 400)},
        )

    analysis = judge(policy, side(1.0, 2), side(canary_slowdown, 3))
    end = timezone.now() - timedelta(minutes=2)
    return StageAnalysis.objects.create(
        **{
            "deployment": deployment,
            "stage": 1,
            "percent": 10,
            "baseline_version": 1,
            "canary_version": 2,
            "window_start": end - timedelta(minutes=5),
            "window_end": end,
            "decision": analysis.decision,
            "action": "rolled back to v1" if analysis.decision == "rollback" else "promoted",
            "score": analysis.score,
            "reason": analysis.reason,
            "verdicts": [v.to_dict() for v in analysis.verdicts],
            "sample": {
                "baseline": {"requests": 400, "instances": ["a"], "unread": [], "truncated": False},
                "canary": {"requests": 400, "instances": ["b"], "unread": ["c"], "truncated": True},
            },
            "policy": policy.to_dict(),
            **fields,
        }
    )


def detail(member, team, deployment) -> str:
    return page_html(member, "web:deployment_detail", team.slug, deployment.pk)


def test_the_page_shows_each_judged_bake_metric_by_metric(member, team, deployment):
    analysis = judged(deployment, canary_slowdown=1.6)
    assert analysis.decision == "rollback"  # latency_s is critical and 60% slower
    html = detail(member, team, deployment)
    text = html_lib.unescape(html)
    assert 'data-testid="canary-analysis"' in html
    assert "Stage 1 (10% on v2)" in text and "v2 vs v1" in text
    assert " UTC</time>" in html and "(5 min 0 s)" in text
    assert 'data-decision="rollback"' in html
    assert "Rollback: rolled back to v1" in text
    assert analysis.reason in text and analysis.reason.startswith("critical metric failed")
    assert f"{analysis.score:.1f} (promotes at 95 or more, rolls back under 75)" in text
    assert "v2: 400 requests read from 1 instance; v2: not read from c" in text
    assert "judged on its last part" in text
    # A real table, a row per metric, with its verdict.
    table = re.search(r'<table class="list canary-metrics".*?</table>', html, re.S)[0]
    assert '<th scope="col">p-value</th>' in table
    rows = dict(re.findall(r'<tr data-metric="(\w+)" data-verdict="(\w+)">', table))
    assert rows == {v["name"]: v["verdict"] for v in analysis.verdicts}
    assert rows["latency_s"] == "fail"
    latency = re.search(r'<tr data-metric="latency_s".*?</tr>', table, re.S)[0]
    verdict = next(v for v in analysis.verdicts if v["name"] == "latency_s")
    assert f"p50 {verdict['baseline_p50'] * 1000:.1f} ms" in latency
    assert f"p50 {(verdict['ratio'] - 1) * 100:+.0f}%" in latency and "allowed 10%" in latency
    assert "< 0.001" in html_lib.unescape(latency)
    assert 'class="badge badge-bad">fail<' in latency
    tokens = re.search(r'<tr data-metric="completion_tokens".*?</tr>', table, re.S)[0]
    assert " tokens" in tokens and "ms" not in tokens
    errors = re.search(r'<tr data-metric="error_rate".*?</tr>', table, re.S)[0]
    assert "0.50%" in errors and "2 of 400 requests" in errors and "3 of 400 requests" in errors
    assert "+0.25 pts" in errors and "(critical)" in errors


def test_a_promoted_bake_reads_as_passes(member, team, deployment):
    analysis = judged(deployment, canary_slowdown=1.0)
    html = detail(member, team, deployment)
    assert analysis.decision == "promote"
    assert 'data-decision="promote"' in html and 'class="badge badge-ok"' in html
    assert 'data-verdict="fail"' not in html


def test_the_bakes_group_by_rollout_newest_first_and_by_stage(member, team, deployment):
    judged(deployment, 1.0)
    judged(deployment, 1.0, stage=2, percent=50)
    judged(deployment, 1.0, stage=2, percent=50, decision="hold", action="held for a person")
    judged(deployment, 1.6, baseline_version=2, canary_version=3)
    rollouts = canary.group(deployment.analyses.all())
    assert [(r.canary_version, [s.stage for s in r.stages]) for r in rollouts] == [
        (3, [1]),
        (2, [1, 2]),
    ]
    assert len(rollouts[1].stages[1].looks) == 2
    text = html_lib.unescape(detail(member, team, deployment))
    assert text.index("v3 vs v2") < text.index("v2 vs v1")
    assert "look 2 of 2" in text


def test_the_panel_shows_only_with_analyses_or_canary_analysis_on(member, team, deployment):
    assert 'data-testid="canary-analysis"' not in detail(member, team, deployment)
    Deployment.objects.filter(pk=deployment.pk).update(canary_analysis=True)
    html = detail(member, team, deployment)
    assert 'data-testid="canary-analysis"' in html and "No bake judged yet." in html


def test_the_charts_shade_the_analysis_windows(member, team, deployment):
    html = page_html(member, "web:deployment_metrics", team.slug, deployment.pk)
    assert "data-analysis-windows" not in html
    analysis = judged(deployment, 1.6)
    html = page_html(member, "web:deployment_metrics", team.slug, deployment.pk)
    found = re.search(r'data-analysis-windows="([^"]*)"', html)
    assert found, html
    [window] = json.loads(html_lib.unescape(found[1]))
    assert window["decision"] == "rollback"
    assert window["start"] == analysis.window_start.isoformat()
    assert window["label"] == "stage 1 (10%) v2 vs v1: rollback"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_charts_shade_the_window_in_a_browser(
    live_server,
    member,
    team,
    rollout,  # noqa: F811
    browser_page,  # noqa: F811
):
    """The window of a bake judged while v2 took 10% is a band on the charts, labelled with
    its decision and listed under them."""
    deployment, _, _ = rollout
    now = timezone.now()
    judged(
        deployment,
        1.0,
        window_start=now - timedelta(minutes=7),
        window_end=now - timedelta(minutes=2),
    )
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + reverse("web:deployment_detail", args=[team.slug, deployment.pk]))
    requests = page.locator("[data-chart=requests]")
    requests.locator("canvas").wait_for()
    page.wait_for_function(
        "document.querySelector('[data-chart=requests]').dataset.windows === 'promote'"
    )
    listed = page.get_by_test_id("chart-markers").locator("li[data-kind=analysis]")
    assert "canary analysis, stage 1 (10%) v2 vs v1: promote" in listed.inner_text()
    panel = page.get_by_test_id("canary-analysis")
    assert panel.get_by_role("row").count() == 4  # the header and three metrics
    shot(page, "canary-analysis")


def test_amounts_read_in_their_units():
    assert canary.amount("latency_s", 0.0421) == "42.1 ms"
    assert canary.amount("ttft_s", 1.2344) == "1,234 ms"
    assert canary.amount("tpot_s", 0.004) == "4.00 ms"
    assert canary.amount("completion_tokens", 212.4) == "212 tokens"
    assert canary.amount("latency_s", None) == "—"
    assert canary.p_value(0.0004) == "< 0.001" and canary.p_value(0.25) == "0.250"
