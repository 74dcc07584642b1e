"""Copy buttons in a real browser: the deployment page's base URL lands on the clipboard, and
the rollout timeline folds (no instance runs: the rows are written here)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from portal.deployments.traffic.routing import endpoint_url
from tests.factories import make_version
from tests.web.test_browser import browser_page, shot, sign_in  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_copy_button_puts_the_base_url_on_the_clipboard(
    live_server,
    member,
    team,
    deployment,
    browser_page,  # noqa: F811
):
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    sign_in(page, live_server.url)
    page.goto(live_server.url + reverse("web:deployment_detail", args=[team.slug, deployment.pk]))

    button = page.get_by_role("button", name="Copy the base URL")
    button.click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('button.copy')].some(b => b.textContent === 'Copied')"
    )
    assert page.evaluate("navigator.clipboard.readText()") == endpoint_url(deployment)
    # The snippets have theirs too, inside their folds.
    assert page.locator("pre[data-copy] + button.copy").count() >= 2

    # The timeline: one fold, open, for the deploy.
    folds = page.get_by_test_id("timeline-group")
    assert folds.count() == 1 and folds.first.get_attribute("open") is not None
    assert "Deploy v1" in folds.first.locator("summary").inner_text()
    shot(page, "deployment-copy-and-timeline")

    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390


def test_the_version_page_fits_a_phone(
    live_server,
    member,
    team,
    model,
    artifact_root,
    release,
    browser_page,  # noqa: F811
):
    long_source = f"file://{artifact_root}/" + "a-very-long-directory-name-" * 6
    version = make_version(
        model,
        artifact_root,
        artifact_uri=long_source,
        engine_args={"dtype": "auto", "max_model_len": 8192, "revision": "r" * 120},
    )
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, live_server.url)
    page.goto(
        live_server.url
        + reverse("web:version_detail", args=[team.slug, model.slug, version.number])
    )
    page.get_by_test_id("version-state").wait_for()
    shot(page, "version-390")
    width = page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= 390, width
