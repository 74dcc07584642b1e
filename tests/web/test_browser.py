"""The portal in a real browser (Debian's chromium driven by Playwright) against the whole
platform: the web server, a real Celery worker, the gateway and real CPU instances.

A model author signs in, registers the demo model and two versions, watches materialization
finish, deploys Red-Black, watches the deployment page move through its stages without
reloading, rolls back from the page, and sees the metrics charts fill after a few requests.
Screenshots of the main pages go to ``$TEST_ARTIFACTS_DIR`` (default ``var/test-artifacts``).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest

from portal.deployments.models import Deployment
from portal.metrics.tasks import scrape_metrics
from portal.registry.services import create_model
from tests.deployments.rollout_helpers import wait_for

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(
    os.environ.get("TEST_ARTIFACTS_DIR", Path(__file__).parents[2] / "var" / "test-artifacts")
)
#: The flags a root, offline, GPU-less machine needs (see docs/operations.md).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def browser_page(monkeypatch):
    if not CHROMIUM.exists():
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        page.on("dialog", lambda dialog: dialog.accept())  # the actions' confirmations
        try:
            yield page
        finally:
            shot(page, "99-last-page")  # where a failed test stopped
            browser.close()


def sign_in(page, base: str) -> None:
    """Sign in as the ``member`` fixture's user and wait for the team's dashboard."""
    page.goto(base + "/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-mia")
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Search").wait_for()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


class Scraper(threading.Thread):
    """What beat does in production: ask a worker to read every live instance's /metrics."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            scrape_metrics.delay()


def register_version(page, artifact: Path, *, first: bool) -> None:
    if not first:
        page.get_by_role("link", name="Add version").click()
    page.get_by_label("Artifact source").fill(f"file://{artifact}")
    page.get_by_label("vLLM (default)").check()
    page.get_by_role("button", name="Register version").click()
    # The version page follows materialization and packaging live, without a reload.
    page.wait_for_function(
        "(document.querySelector('[data-testid=version-state]')?.textContent || '').trim() === 'Ready'",
        timeout=120_000,
    )


def try_in_playground(page) -> None:
    """Make a temporary key and send the playground's prefilled try; wait for a 200."""
    page.get_by_role("button", name="Make a 1-hour key").click()
    page.get_by_test_id("playground-meta").filter(has_text="until").wait_for()
    page.get_by_role("button", name="Send", exact=True).click()
    page.wait_for_function(
        "document.querySelector('[data-testid=playground-answer]')?.dataset.status === '200'",
        timeout=60_000,
    )


def stage_seen(page, text: str) -> None:
    page.wait_for_function(
        f"(document.querySelector('[data-testid=stage]')?.textContent || '').includes({text!r})",
        timeout=120_000,
    )


def state_is(page, label: str, timeout: int = 120_000) -> None:
    page.wait_for_function(
        f"(document.querySelector('[data-testid=observed-state]')?.textContent || '').trim() === {label!r}",
        timeout=timeout,
    )


def test_an_author_registers_deploys_rolls_back_and_sees_metrics(
    rollout_world, live_server, member, browser_page, settings
):
    page, base = browser_page, live_server.url
    settings.GATEWAY_URL = rollout_world.gateway_url  # what the deployment page shows callers
    artifact = rollout_world.artifact_root / "demo-tiny"
    shutil.copytree(rollout_world._weights, artifact)

    # Sign in with the keyboard alone.
    page.goto(base + "/")
    page.get_by_label("Username").focus()
    page.keyboard.type("mia")
    page.keyboard.press("Tab")
    page.keyboard.type("pw-mia")
    shot(page, "01-sign-in")
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Search").wait_for()

    # Register the model and its first version; watch it become ready.
    page.get_by_role("link", name="Register model").first.click()
    page.get_by_label("Name").fill("tiny")
    page.get_by_role("button", name="Register and add a version").click()
    shot(page, "02-add-version")
    register_version(page, artifact, first=True)
    shot(page, "03-version-ready")

    # Deploy v1 Red-Black and wait until it serves.
    page.get_by_role("link", name="Deploy v1").click()
    page.get_by_label("Bake time (seconds)").fill("6")
    page.get_by_label("Stages").fill("50, 100")
    shot(page, "04-deploy-form")
    page.get_by_role("button", name="Deploy").click()
    page.evaluate("window.__noReload = true")
    state_is(page, "Serving")
    assert page.evaluate("window.__noReload") is True
    deployment = Deployment.objects.get(model__slug="tiny")

    # The playground answers from the page: through the gateway, with a key made for it.
    try_in_playground(page)
    assert page.get_by_test_id("playground-answer").inner_text().strip()
    shot(page, "04b-playground-chat")

    # A few requests through the gateway, then the charts fill from the scraped /metrics.
    scraper = Scraper()
    scraper.start()
    try:
        endpoint = page.get_by_test_id("base-url").inner_text()
        served_model = page.get_by_test_id("served-model").inner_text()

        def requests_charted() -> bool:
            answer = httpx.post(
                endpoint + "/chat/completions",
                json={
                    "model": served_model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                },
                headers=rollout_world.auth,
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            peak = "document.querySelector('[data-chart=requests]')?.dataset.peak || 0"
            return page.evaluate(f"Number({peak}) > 0")

        wait_for(requests_charted, 90, "the requests chart to show the calls", interval=0.5)
        page.get_by_test_id("charts").scroll_into_view_if_needed()
        shot(page, "05-deployment-serving-with-metrics")

        # Register v2 and roll it out Red-Black; the page follows the stages by itself.
        page.get_by_role("link", name="tiny").first.click()
        page.get_by_test_id("charts").wait_for()  # the model page merges its deployments' points
        shot(page, "06-model-page")
        register_version(page, artifact, first=False)
        page.get_by_role("link", name="Deploy v2").click()
        page.get_by_label("Bake time (seconds)").fill("40")  # time to roll back mid-rollout
        page.get_by_role("button", name="Deploy").click()
        page.evaluate("window.__noReload = true")
        stage_seen(page, "Baking v2 at 50% (stage 1 of 2)")
        page.wait_for_function(
            "(document.querySelector('[data-testid=traffic]')?.textContent || '').includes('v2 50%')",
            timeout=120_000,
        )
        shot(page, "07-rollout-at-50-percent")
        assert page.evaluate("window.__noReload") is True

        # Roll back from the page (the confirmation is accepted); v1 serves everything again.
        page.get_by_role("button", name="Rollback").click()
        state_is(page, "Serving")
        page.wait_for_function(
            "(document.querySelector('[data-testid=traffic]')?.textContent || '').includes('v1 100%')",
            timeout=120_000,
        )
        stage_seen(page, "Rolled back from v2 to v1")
        shot(page, "08-rolled-back")
        timeline = page.get_by_test_id("timeline").inner_text()
        assert "Rollback requested" in timeline
        deployment.refresh_from_db()
        assert deployment.target_version.number == 1 and deployment.traffic == {1: 100}
    finally:
        scraper.stop.set()

    # A CI token: shown once, then listed by its prefix only, and revocable.
    page.get_by_role("link", name="API tokens").click()
    page.get_by_label("Name").fill("ci-main")
    page.get_by_role("button", name="Create token").click()
    plaintext = page.get_by_test_id("new-token").locator("code").inner_text()
    shot(page, "09-token-created")
    answer = httpx.get(
        base + "/api/v1/deployments/", headers={"Authorization": f"Bearer {plaintext}"}
    )
    assert answer.status_code == 200 and answer.json()["count"] == 1
    page.get_by_role("button", name="Revoke").click()
    page.get_by_text("Token revoked").wait_for()
    assert plaintext not in page.content()
    answer = httpx.get(
        base + "/api/v1/deployments/", headers={"Authorization": f"Bearer {plaintext}"}
    )
    assert answer.status_code == 401

    # At a phone's width nothing overflows sideways, long names included.
    create_model(
        team=deployment.model.team, slug="a" * 20 + "-very-long-model-name-" + "b" * 21, task="chat"
    )
    page.set_viewport_size({"width": 390, "height": 844})
    for name, path in [
        ("10-dashboard-phone", f"/t/{deployment.model.team.slug}/"),
        ("11-deployment-phone", f"/t/{deployment.model.team.slug}/deployments/{deployment.pk}/"),
        ("12-version-phone", f"/t/{deployment.model.team.slug}/models/tiny/v1/"),
        ("13-deploy-form-phone", f"/t/{deployment.model.team.slug}/models/tiny/deploy/?version=2"),
        ("14-model-phone", f"/t/{deployment.model.team.slug}/models/tiny/"),
        ("15-new-version-phone", f"/t/{deployment.model.team.slug}/models/tiny/versions/new/"),
        ("16-new-model-phone", f"/t/{deployment.model.team.slug}/models/new/"),
        ("17-caller-keys-phone", f"/t/{deployment.model.team.slug}/keys/"),
        ("18-tokens-phone", f"/t/{deployment.model.team.slug}/tokens/"),
    ]:
        page.goto(base + path)
        page.wait_for_timeout(500)
        shot(page, name)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), name


def test_an_author_deploys_the_embedding_demo_and_calls_it_from_the_snippet_shown(
    rollout_world, live_server, member, browser_page, settings, capsys, monkeypatch
):
    """The Python-backend path in the browser: the embedding demo registered with its I/O spec
    and model.py through the forms, deployed Red-Black, and called by running the tritonclient
    program its deployment page shows, as shown."""
    import json

    from serving.demo_embedding import IO_SPEC, export_weights

    page, base = browser_page, live_server.url
    settings.GATEWAY_URL = rollout_world.gateway_url
    artifact = export_weights(rollout_world.artifact_root / "demo-embed")

    page.goto(base + "/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-mia")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="Register model").first.click()
    page.get_by_label("Name").fill("embed")
    page.get_by_label("Task").select_option("embedding")
    page.get_by_role("button", name="Register and add a version").click()
    page.get_by_label("Artifact source").fill(f"file://{artifact}")
    page.get_by_label("Python (custom model.py)").check()
    # The Python backend has one API surface: the form says so instead of offering a choice.
    assert page.get_by_test_id("python-surface").is_visible()
    assert not page.get_by_label("KServe v2 gRPC only (standalone Triton)").is_visible()
    page.get_by_label("I/O spec (Python backend)").fill(json.dumps(IO_SPEC))
    model_py = Path(__file__).parents[2] / "serving" / "demo_embedding_model.py"
    page.get_by_label("model.py (Python backend)").set_input_files(str(model_py))
    page.get_by_role("button", name="Register version").click()
    page.wait_for_function(
        "(document.querySelector('[data-testid=version-state]')?.textContent || '').trim() === 'Ready'",
        timeout=120_000,
    )
    page.get_by_role("link", name="Deploy v1").click()
    page.get_by_role("button", name="Deploy").click()
    state_is(page, "Serving", timeout=180_000)
    page.reload()  # the call section is drawn with the page: now with the ready instance
    shot(page, "20-embedding-deployment")
    assert "OpenAI(base_url=" not in page.content()
    assert page.get_by_test_id("kserve-http").inner_text().endswith("/models/search/embed")

    program = page.get_by_test_id("snippet-http").inner_text()
    monkeypatch.setenv("MODEL_API_KEY", rollout_world.caller_key)  # as the page tells callers
    capsys.readouterr()
    exec(compile(program, "snippet", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("EMBEDDING [[") and "dtype" not in printed, printed

    # The playground's infer form starts from the I/O spec and gets the embedding back.
    try_in_playground(page)
    reply = json.loads(page.get_by_test_id("playground-answer").inner_text())
    assert [o["name"] for o in reply["outputs"]] == ["EMBEDDING"]
    shot(page, "21-playground-infer")
