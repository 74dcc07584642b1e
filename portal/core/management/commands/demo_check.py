"""What ``./dev demo`` runs once the platform is up: wait for the demo deployment to serve,
call it as the README shows (the official ``openai`` client, plain and with a JSON-schema
``response_format``), and take screenshots of the main pages when a browser is installed.

It exits non-zero with the reason when any step fails, so it doubles as a smoke test.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from portal.deployments.models import Deployment, ObservedState

PICK: Any = {
    "type": "json_schema",
    "json_schema": {
        "name": "pick",
        "schema": {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green"]}},
            "required": ["colour"],
            "additionalProperties": False,
        },
    },
}
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))


class Command(BaseCommand):
    help = "Wait for the demo deployment, call it with the openai client, take screenshots."

    def add_arguments(self, parser):
        parser.add_argument("--team", default="demo")
        parser.add_argument("--timeout", type=float, default=300)
        parser.add_argument("--portal-url", default="http://127.0.0.1:8000")
        parser.add_argument("--user", default="admin")
        parser.add_argument("--password", default="admin")
        parser.add_argument(
            "--exit",
            action="store_true",
            help="Exit once the check passed (else wait, so ./dev demo keeps running).",
        )

    def handle(self, *args, team: str, timeout: float, portal_url: str, **options):
        deployment = self._wait_until_serving(team, timeout)
        from portal.deployments.routing import endpoint_url
        from portal.registry.packaging import triton_model_name

        base_url = endpoint_url(deployment)
        model = triton_model_name(deployment.target_version)
        self.stdout.write(f"==> the demo deployment serves at {base_url} (model {model})")
        self._call(base_url, model)
        self._screenshots(portal_url, deployment, options["user"], options["password"])
        self.stdout.write(self.style.SUCCESS("Demo check passed."))
        self.stdout.flush()
        if not options["exit"]:
            signal.pause()  # honcho stops everything when this process ends

    def _wait_until_serving(self, team: str, timeout: float) -> Deployment:
        deadline = time.monotonic() + timeout
        deployment = None
        while time.monotonic() < deadline:
            try:
                deployment = (
                    Deployment.objects.filter(model__team__slug=team, model__slug="tiny")
                    .select_related("model__team", "target_version")
                    .first()
                )
            except DatabaseError:  # ./dev run is still migrating the database
                time.sleep(2)
                continue
            if deployment is not None and deployment.observed_state == ObservedState.SERVING:
                return deployment
            time.sleep(2)
        raise CommandError(
            f"The demo deployment did not serve within {timeout:.0f} s "
            f"(last state: {deployment.observed_state if deployment else 'none'}; "
            f"{deployment.status_message if deployment else ''})."
        )

    def _call(self, base_url: str, model: str) -> None:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=2)
        messages: Any = [{"role": "user", "content": "Pick a colour"}]
        try:
            plain = client.chat.completions.create(model=model, messages=messages, max_tokens=12)
            picked = client.chat.completions.create(
                model=model, messages=messages, max_tokens=20, response_format=PICK
            )
        except openai.OpenAIError as exc:
            raise CommandError(f"Calling {base_url} failed: {exc}") from exc
        self.stdout.write(f"    plain answer: {plain.choices[0].message.content!r}")
        content = picked.choices[0].message.content or ""
        try:
            colour = json.loads(content)["colour"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CommandError(f"The JSON-schema answer is not valid: {content!r}") from exc
        if colour not in ("red", "green"):
            raise CommandError(f"The JSON-schema answer broke its schema: {content!r}")
        self.stdout.write(f"    JSON-schema answer: {content}")

    def _screenshots(self, portal_url: str, deployment: Deployment, user: str, password: str):
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            self.stdout.write("    (no screenshots: playwright is not installed)")
            return
        if not CHROMIUM.exists():
            self.stdout.write(
                f"    (no screenshots: {CHROMIUM} is missing; apt-get install chromium)"
            )
            return
        out = settings.VAR_DIR / "demo-screenshots"
        out.mkdir(parents=True, exist_ok=True)
        team, model = deployment.model.team.slug, deployment.model.slug
        pages = {
            "dashboard": f"/t/{team}/",
            "model": f"/t/{team}/models/{model}/",
            "version": f"/t/{team}/models/{model}/v{deployment.target_version.number}/",
            "deployment": f"/t/{team}/deployments/{deployment.pk}/",
        }
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(portal_url + "/accounts/login/")
            page.get_by_label("Username").fill(user)
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_load_state()
            for name, path in pages.items():
                page.goto(portal_url + path)
                page.wait_for_timeout(1500)  # the live fragments load after the page
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
            browser.close()
        self.stdout.write(f"    screenshots in {out}")
