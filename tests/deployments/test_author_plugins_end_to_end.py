"""The worked example of author plugins (docs/plugins.md) through the whole platform.

The two example wheels (examples/plugins, built with pip) are uploaded through the API; a
checkpoint of the custom architecture one of them registers (``TinyBigramForCausalLM``) is
registered as a version naming both; a real worker materializes and packages it; the controller
deploys it; the instance installs and checks the wheels; and the official ``openai`` client calls
it through the gateway, with and without the example processor's per-request window.
"""

from __future__ import annotations

import openai
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from portal.registry.models import ModelVersion, VersionState
from tests.api.helpers import ok
from tests.deployments.rollout_helpers import explain, wait_for
from tests.plugin_examples import example_wheels, make_bigram_checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVED_NAME = "search--bigram"
MAX_TOKENS = 16


def tokens_of(completion) -> list[str]:
    """The generated tokens, one string each (the example checkpoint's are all distinct)."""
    return [item.token for item in completion.choices[0].logprobs.content]


def repeats_within(tokens: list[str], window: int) -> list[int]:
    return [i for i, t in enumerate(tokens) if t in tokens[max(0, i - window) : i]]


def test_the_example_plugins_deploy_and_serve_with_per_request_arguments(
    rollout_world, api, member_token, demo_weights
):
    world = rollout_world
    client = api(member_token)
    uploaded = []
    for path in example_wheels().values():
        wheel = SimpleUploadedFile(path.name, path.read_bytes(), "application/octet-stream")
        response = client.post("/api/v1/plugins/", {"wheel": wheel}, format="multipart")
        uploaded.append(ok(response, 201)["sha256"])
    model = world.model("bigram")
    make_bigram_checkpoint(world.artifact_root / "bigram", demo_weights)
    body = {
        "model": model.pk,
        "artifact_uri": f"file://{world.artifact_root / 'bigram'}",
        "plugins": uploaded,
    }
    version = ModelVersion.objects.get(
        pk=ok(client.post("/api/v1/versions/", body, format="json"), 201)["id"]
    )

    def ready():
        version.refresh_from_db()
        assert version.state != VersionState.FAILED, version.failure_reason
        return version.state == VersionState.READY

    wait_for(ready, 120, "the version to be packaged")
    deployment = world.deploy(model, version, replicas=1)

    def serving():
        deployment.refresh_from_db()
        assert deployment.observed_state not in ("failed", "aborted"), deployment.status_message
        return deployment.observed_state == "serving"

    wait_for(
        serving, 180, "the deployment to serve", explain=lambda: explain(deployment, world.run_root)
    )

    caller = openai.OpenAI(base_url=f"{world.endpoint(model)}/v1", api_key=world.caller_key)

    def chat(**extra):
        return caller.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": "Hello world"}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            logprobs=True,
            extra_body={"ignore_eos": True, **extra},
        )

    plain = tokens_of(chat())
    assert len(plain) == MAX_TOKENS
    assert len(set(plain[1:])) == 1  # the bigram's favourite successor is itself
    for window in (2, 5):
        windowed = tokens_of(chat(vllm_xargs={"no_repeat_window": window}))
        assert len(windowed) == MAX_TOKENS
        assert repeats_within(windowed, window) == [], windowed
        assert windowed != plain
    # The processor's own validation, as vLLM runs it, is the caller's 400.
    with pytest.raises(openai.BadRequestError, match="no_repeat_window"):
        chat(vllm_xargs={"no_repeat_window": -1})
