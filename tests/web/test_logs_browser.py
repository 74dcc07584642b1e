"""The deployment page's Logs panel: a failed instance's end shown once and formatted, and, in
a real browser, a line appended to an instance's log appearing without a reload.

No rollout: an Instance row and a run directory written by the test are what the local
launcher reads, as it would read a real instance's."""

from __future__ import annotations

import pytest
from django.urls import reverse

from portal.deployments.lifecycle import transition_instance
from portal.deployments.models import Instance, InstanceState
from portal.deployments.runtime.launchers import version_set
from tests.deployments.test_instance_logs import STEP_FAILED, append, run_dir
from tests.web.test_browser import browser_page, shot  # noqa: F401


def page_url(deployment) -> str:
    return reverse("web:deployment_detail", args=[deployment.model.team.slug, deployment.pk])


def instance_with_log(settings, tmp_path, deployment, name: str, text: str):
    settings.INSTANCE_LAUNCHER = "local"
    settings.INSTANCE_RUN_ROOT = tmp_path / "instances"
    row = Instance.objects.create(
        deployment=deployment, version=deployment.target_version, name=name, launcher="local"
    )
    key = version_set(deployment, deployment.target_version).key
    directory = run_dir(settings.INSTANCE_RUN_ROOT, key, name)
    append(directory, text)
    return row, directory


@pytest.mark.django_db
def test_a_failed_instance_shows_its_end_once_formatted(
    client, member, settings, tmp_path, deployment
):
    row, _ = instance_with_log(
        settings, tmp_path, deployment, "broken-1", "unpacking\n" + STEP_FAILED + "\n"
    )
    transition_instance(row, InstanceState.STARTING)
    transition_instance(row, InstanceState.FAILED, message="start-up failed at start_engine")
    client.force_login(member)
    html = client.get(page_url(deployment)).content.decode()
    assert html.count('data-testid="failure-summary"') == 1
    assert "start_engine failed in 1.25 s: RuntimeError: tritonserver exited with 1" in html
    assert "&quot;status&quot;" not in html and '"status": "failed"' not in html  # no raw JSON
    assert "start-up failed at start_engine" in html


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_line_appended_to_the_log_appears_without_a_reload(
    live_server,
    member,
    browser_page,  # noqa: F811
    settings,
    tmp_path,
    deployment,
):
    page = browser_page
    _, directory = instance_with_log(
        settings, tmp_path, deployment, "live-1", "first line\nsecond line\n"
    )
    page.goto(live_server.url + "/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-mia")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "login" not in url)
    page.goto(live_server.url + page_url(deployment))
    lines = page.get_by_test_id("log-lines")
    lines.get_by_text("second line").wait_for()
    append(directory, "appended while watching\n")
    lines.get_by_text("appended while watching").wait_for(timeout=10_000)
    assert page.get_by_test_id("log-status").inner_text() == "following"
    append(directory, "a long line without spaces: " + "x" * 400 + "\n")
    lines.get_by_text("a long line without spaces").wait_for(timeout=10_000)
    page.set_viewport_size({"width": 390, "height": 844})
    panel = page.get_by_test_id("instance-logs")
    assert panel.evaluate("e => e.scrollWidth <= e.clientWidth"), "the panel overflows at 390 px"
    shot(page, "logs-390")
