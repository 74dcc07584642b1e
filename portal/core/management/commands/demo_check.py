"""What ``./dev demo`` runs once the platform is up: wait for the demo deployment to serve,
call it as the README shows (the official ``openai`` client, plain and with a JSON-schema
``response_format``), call the embedding demo (when ``bootstrap_demo`` deployed one) with
``tritonclient`` through the gateway, both with the caller key ``bootstrap_demo`` saved to
``var/demo-caller-key``, and take screenshots of the main pages when a browser is
installed.

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
        deployment = self._wait_until_serving(team, "tiny", timeout)
        from portal.deployments.traffic.routing import endpoint_url, kserve_url
        from portal.registry.models import Model
        from portal.registry.packaging import triton_model_name

        self.caller_key = self._caller_key()
        base_url = endpoint_url(deployment)
        model = triton_model_name(deployment.target_version)
        self.stdout.write(f"==> the demo deployment serves at {base_url} (model {model})")
        self._call(base_url, model)
        embed = None
        if Model.objects.filter(team__slug=team, slug="embed").exists():
            embed = self._wait_until_serving(team, "embed", timeout)
            url, name = kserve_url(embed), triton_model_name(embed.target_version)
            self.stdout.write(f"==> the embedding demo serves at {url} (KServe v2, model {name})")
            self._call_embedding(url, name)
        self._screenshots(portal_url, deployment, embed, options["user"], options["password"])
        self.stdout.write(self.style.SUCCESS("Demo check passed."))
        self.stdout.flush()
        if not options["exit"]:
            signal.pause()  # honcho stops everything when this process ends

    def _wait_until_serving(self, team: str, slug: str, timeout: float) -> Deployment:
        deadline = time.monotonic() + timeout
        deployment = None
        while time.monotonic() < deadline:
            try:
                deployment = (
                    Deployment.objects.filter(model__team__slug=team, model__slug=slug)
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
            f"The demo deployment {team}/{slug} did not serve within {timeout:.0f} s "
            f"(last state: {deployment.observed_state if deployment else 'none'}; "
            f"{deployment.status_message if deployment else ''})."
        )

    def _caller_key(self) -> str:
        """The demo's caller key, as a caller keeps it: outside the code."""
        path = settings.VAR_DIR / "demo-caller-key"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            raise CommandError(
                f"No caller key in {path}: run `manage.py bootstrap_demo` first."
            ) from None

    def _call(self, base_url: str, model: str) -> None:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=self.caller_key, max_retries=2)
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

    def _call_embedding(self, url: str, model: str) -> None:
        """Two near sentences and a far one: unit vectors, the near pair the most similar."""
        import numpy as np
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Revenue grew 4%."]
        tensor = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
        try:
            client = httpclient.InferenceServerClient(url.split("://", 1)[1])
            headers = {"Authorization": f"Bearer {self.caller_key}"}
            vectors = client.infer(model, [tensor], headers=headers).as_numpy("EMBEDDING")
        except (InferenceServerException, OSError) as exc:
            raise CommandError(f"Calling {url} failed: {exc}") from exc
        if vectors is None or vectors.shape[0] != len(texts):
            raise CommandError(f"The embedding answer has the wrong shape: {vectors!r}")
        if not np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4):
            raise CommandError("The embeddings are not unit vectors.")
        similarity = vectors @ vectors.T
        if not similarity[0, 1] > similarity[0, 2]:
            raise CommandError(f"The embeddings do not rank similar sentences: {similarity}")
        self.stdout.write(
            f"    embeddings: {vectors.shape[1]} dimensions; cat~kitten "
            f"{similarity[0, 1]:.2f}, cat~revenue {similarity[0, 2]:.2f}"
        )

    def _screenshots(
        self,
        portal_url: str,
        deployment: Deployment,
        embed: Deployment | None,
        user: str,
        password: str,
    ):
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
        if embed is not None:  # the Python-backend path: KServe v2 endpoints, tritonclient
            pages["embedding-deployment"] = f"/t/{team}/deployments/{embed.pk}/"
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
