"""The README's "Using the API from CI" script, run as written against a live portal: every
call succeeds until the rollout step, which names a version that does not exist here; the
script shows that refusal's JSON body and stops, as a CI job would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from portal.deployments.models import Deployment

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.django_db(transaction=True)


def readme_ci_script() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using the API from CI", 1)[1]
    script = re.search(r"```bash\n(.*?)```", section, re.S)
    assert script is not None
    return script.group(1)


def test_the_readme_ci_script_runs_and_shows_errors_as_json(
    live_server, member_token, team, release, cpu_instance_type, settings
):
    if shutil.which("jq") is None:
        pytest.fail("jq is missing (apt-get install jq): the README's CI example uses it")
    script = readme_ci_script()
    lines = script.splitlines()
    assert lines[0].startswith("TOKEN=") and lines[1].startswith("API=")
    body = "\n".join(lines[2:])  # the token and the URL come from the environment here
    env = {
        **os.environ,
        "TOKEN": member_token,
        "API": f"{live_server.url}/api/v1",
        "CI_PIPELINE_ID": "4242",
        "NEXT_ID": "999999",
    }
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0, run.stdout
    # It registered, deployed and followed the deployment...
    deployment = Deployment.objects.get(model__slug="support-bot")
    assert deployment.stages == [25, 50, 100] and deployment.bake_seconds == 120
    assert run.stdout.strip().splitlines()[-1] == "Waiting for v1 to be ready (registered)"
    # ...then the refused step reads as the API's JSON error, and nothing ran after it.
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith('HTTP 400: {"error":{"code":"invalid"'), run.stderr
    assert "No version with id 999999." in error and "Traceback" not in run.stderr
    assert not deployment.events.filter(kind="action").exists()  # no rollback was sent
