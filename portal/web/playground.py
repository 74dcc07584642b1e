"""The deployment page's playground: a person tries a deployed model from the portal, through
the gateway and with a caller key, exactly as a program would call it.

The portal never keeps a caller key's plaintext: the browser holds the key (one the person
pastes, or a temporary one the portal issues and shows once), sends it with each try, and the
portal forwards the request to the deployment's base URL with it. Going through the gateway
means the try counts against the key's and the team's rate limits, reaches whichever version
the traffic split picks, and fails as a caller's request would (401, 429, 503).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.utils import timezone

from portal.accounts.models import Team
from portal.deployments.models import Deployment
from portal.deployments.traffic.caller_keys import IssuedCallerKey, issue_caller_key
from portal.deployments.traffic.routing import endpoint_url, serves_openai
from portal.registry.packaging import triton_model_name
from portal.web.snippets import sample_shape, wire_datatype

#: A try is a try: short answers, and a web thread is not held for long.
MAX_TOKENS = 256
TIMEOUT_SECONDS = 60.0
#: How long a key issued for the playground lasts.
TEMPORARY_KEY_LIFETIME = timedelta(hours=1)
#: The largest request body the playground forwards (a chat message or an infer request).
MAX_BODY_BYTES = 64 * 1024


class PlaygroundError(ValueError):
    """A try that is not sent: the message says why (the page shows it)."""


@dataclass(frozen=True)
class Answer:
    """What the gateway answered, passed on as it came, with how long it took."""

    status: int
    body: Any
    milliseconds: float


def kind(deployment: Deployment) -> str:
    """``chat`` for a version that serves OpenAI routes, else ``infer`` (KServe v2)."""
    return "chat" if serves_openai(deployment) else "infer"


def sample_infer_request(io_spec: dict[str, Any]) -> dict[str, Any]:
    """A KServe v2 infer request with one sample value per input, from the I/O spec: the
    starting point of the infer form (the tritonclient snippet builds the same tensors)."""
    inputs = []
    for tensor in io_spec.get("inputs", []):
        shape = sample_shape(io_spec, tensor["dims"])
        count = 1
        for size in shape:
            count *= size
        value: Any = "Hello from the playground"
        if tensor["data_type"] == "TYPE_BOOL":
            value = True
        elif tensor["data_type"] != "TYPE_STRING":
            value = 1
        inputs.append(
            {
                "name": tensor["name"],
                "shape": shape,
                "datatype": wire_datatype(tensor["data_type"]),
                "data": [value] * count,
            }
        )
    return {"inputs": inputs}


def playground_context(deployment: Deployment) -> dict[str, Any]:
    """What the page's panel needs: which form to show, and the infer form's starting request."""
    context: dict[str, Any] = {"playground_kind": kind(deployment)}
    if context["playground_kind"] == "infer":
        sample = sample_infer_request(deployment.target_version.io_spec or {})
        context["playground_sample"] = json.dumps(sample, indent=2)
    return context


def issue_temporary_key(deployment: Deployment, user) -> IssuedCallerKey:
    """A caller key for this deployment's model only, expiring in an hour, listed (and
    revocable) on the team's Caller keys page like any other."""
    team: Team = deployment.model.team
    return issue_caller_key(
        team=team,
        name=f"playground · {user.get_username()}"[:100],
        models=[deployment.model],
        expires_at=timezone.now() + TEMPORARY_KEY_LIFETIME,
        created_by=user,
    )


def chat_request(deployment: Deployment, message: Any, max_tokens: Any) -> dict[str, Any]:
    if not isinstance(message, str) or not message.strip():
        raise PlaygroundError("Write a message to send.")
    try:
        tokens = int(max_tokens)
    except (TypeError, ValueError):
        raise PlaygroundError(
            f"Max tokens must be a whole number from 1 to {MAX_TOKENS}."
        ) from None
    if not 1 <= tokens <= MAX_TOKENS:
        raise PlaygroundError(f"Max tokens must be a whole number from 1 to {MAX_TOKENS}.")
    return {
        "model": triton_model_name(deployment.target_version),
        "messages": [{"role": "user", "content": message}],
        "max_tokens": tokens,
    }


def send(deployment: Deployment, key: str, payload: dict[str, Any]) -> Answer:
    """Forward one try to the deployment's base URL with ``key``: a chat completion, or a
    KServe v2 infer request of its served model."""
    if not key or not key.isascii() or len(key) > 200:
        raise PlaygroundError("Give a caller key (or make a temporary one).")
    if kind(deployment) == "chat":
        url = f"{endpoint_url(deployment)}/chat/completions"
    else:
        url = f"{endpoint_url(deployment)}/v2/models/{triton_model_name(deployment.target_version)}/infer"
    started = time.perf_counter()
    try:
        response = httpx.post(
            url,
            json=payload,
            headers={"Authorization": f"Bearer {key}"},
            timeout=TIMEOUT_SECONDS,
        )
    except httpx.HTTPError as exc:
        raise PlaygroundError(f"The gateway did not answer: {type(exc).__name__}.") from exc
    elapsed = (time.perf_counter() - started) * 1000
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text[:4000]
    return Answer(response.status_code, body, round(elapsed, 1))
