"""The deployment page's rollout aids: the timeline folded by rollout, the bake countdown with
promote, roll forward after a rollback, and copy buttons."""

from __future__ import annotations

import html as html_lib
import re
import time

import pytest
from django.urls import reverse

from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import Deployment, ObservedState
from portal.deployments.state.rollout_state import Phase, RolloutStep
from portal.registry.models import VersionState
from portal.web.timeline import group_by_rollout
from tests.factories import make_version
from tests.web.test_pages import page_html

pytestmark = pytest.mark.django_db


@pytest.fixture
def v2(model, artifact_root, version):
    newer = make_version(model, artifact_root)
    type(newer).objects.filter(pk=newer.pk).update(state=VersionState.READY)
    newer.refresh_from_db()
    return newer


def rolling_out(deployment: Deployment, version, v2, **step) -> Deployment:
    """The deployment mid-rollout v1 → v2, as the controller leaves it."""
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="v1 starting")
    transition_deployment(
        deployment,
        ObservedState.SERVING,
        reason="v1 serves 100%",
        traffic={version.number: 100},
        current_stage=1,
    )
    transition_deployment(
        deployment,
        ObservedState.PENDING,
        reason=f"New rollout v{version.number} → v{v2.number}.",
        previous_version=version,
        target_version=v2,
        current_stage=0,
        data={"from_version": version.number, "version": v2.number},
    )
    transition_deployment(
        deployment,
        ObservedState.PROGRESSING,
        reason="stage 1",
        current_stage=1,
        traffic={version.number: 50, v2.number: 50},
        step=RolloutStep(**step),
    )
    deployment.refresh_from_db()
    return deployment


def test_the_timeline_is_folded_by_rollout_newest_open(member, team, deployment, version, v2):
    rolling_out(deployment, version, v2, phase=Phase.SCALE)
    groups = group_by_rollout(list(deployment.events.order_by("-created_at", "-id")))
    assert [g.title for g in groups] == [f"Rollout v1 → v{v2.number}", "Deploy v1"]
    assert groups[0].outcome == "progressing" and groups[1].outcome == "serving"
    assert len(groups[1].events) == 3  # created, progressing, serving
    assert groups[1].events[-1].kind == "created"  # each group newest first, its start last
    html = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    folds = re.findall(r'<details class="rollout-group"[^>]*>', html)
    assert len(folds) == 2 and " open" in folds[0] and " open" not in folds[1]


def test_a_cut_short_history_starts_with_earlier_events(deployment):
    events = list(deployment.events.order_by("-created_at", "-id"))
    assert [g.title for g in group_by_rollout(events[:-1] or events)] in (
        ["Earlier events"],
        ["Deploy v1"],
    )
    assert group_by_rollout([]) == []


def test_a_bake_counts_down_and_offers_to_finish_now(member, team, deployment, version, v2):
    Deployment.objects.filter(pk=deployment.pk).update(bake_seconds=600, stages=[50, 100])
    rolling_out(deployment, version, v2, phase=Phase.BAKE, bake_started_at=time.time() - 5)
    html = html_lib.unescape(page_html(member, "web:deployment_live", team.slug, deployment.pk))
    countdown = re.search(r'data-testid="bake-countdown">(.*?)</p>', html, re.S)
    assert countdown is not None
    assert re.match(r"Bake ends in 9 min 5\d s: then stage 2\.", countdown.group(1))
    assert "Promote to finish the rollout now." in countdown.group(1)
    assert "/promote/" in html


def test_no_countdown_outside_a_bake(member, team, deployment, version, v2):
    rolling_out(deployment, version, v2, phase=Phase.SCALE)
    html = page_html(member, "web:deployment_live", team.slug, deployment.pk)
    assert "bake-countdown" not in html


def test_after_a_rollback_the_page_offers_to_roll_forward(member, team, deployment, version, v2):
    rolling_out(deployment, version, v2, phase=Phase.BAKE, bake_started_at=time.time())
    transition_deployment(deployment, ObservedState.ROLLING_BACK, reason="error rate 40%")
    transition_deployment(
        deployment,
        ObservedState.SERVING,
        reason="Rolled back to v1",
        target_version=version,
        previous_version=None,
        current_stage=0,
        traffic={version.number: 100},
        data={"rolled_back_from": v2.number, "reason": "error rate 40%"},
    )
    html = page_html(member, "web:deployment_live", team.slug, deployment.pk)
    deploy = reverse("web:deploy", args=[team.slug, deployment.model.slug])
    assert f'href="{deploy}?version={v2.number}">Roll forward to v{v2.number}</a>' in html


def test_urls_snippets_and_secrets_shown_once_carry_copy_buttons(member, team, deployment):
    html = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    assert html.count("data-copy=") >= 3  # the base URL and both snippets
    assert "web/copy.js" in html
