"""The deployment page's playground: JSON endpoints the page's script calls. Thin over
:mod:`portal.web.playground`."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_http_methods

from portal.deployments.models import LIVE_STATES
from portal.deployments.traffic.caller_keys import CallerKeyError
from portal.web import playground
from portal.web.teams import team_context
from portal.web.views.deployments import get_deployment
from portal.web.views.registry import require_write
from serving.request_limits import BadBody, check_json_body


def _refused(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@login_required
@require_http_methods(["POST"])
def playground_key(request: HttpRequest, team: str, pk: int) -> JsonResponse:
    """Issue a temporary caller key for this deployment's model; the plaintext goes to the
    browser once and is not kept here."""
    ctx = team_context(request, team)
    require_write(ctx)
    deployment = get_deployment(ctx, pk)
    try:
        issued = playground.issue_temporary_key(deployment, request.user)
    except CallerKeyError as exc:
        return _refused(exc.message)
    expires_at = issued.key.expires_at
    assert expires_at is not None  # a playground key always expires
    return JsonResponse({"key": issued.plaintext, "expires_at": expires_at.isoformat()}, status=201)


@login_required
@require_http_methods(["POST"])
def playground_send(request: HttpRequest, team: str, pk: int) -> JsonResponse:
    """Send one try through the gateway with the caller key the browser holds."""
    ctx = team_context(request, team)
    deployment = get_deployment(ctx, pk)
    if deployment.observed_state not in LIVE_STATES or not deployment.traffic:
        return _refused("Nothing serves this deployment yet; try again once it serves.", 409)
    if len(request.body) > playground.MAX_BODY_BYTES:
        return _refused(f"A try is at most {playground.MAX_BODY_BYTES // 1024} KiB.", 413)
    try:
        data = json.loads(check_json_body(request.body))
    except (BadBody, ValueError) as exc:
        return _refused(f"Not a JSON request: {exc}.")
    if not isinstance(data, dict):
        return _refused("Not a JSON object.")
    try:
        if playground.kind(deployment) == "chat":
            payload = playground.chat_request(
                deployment, data.get("message"), data.get("max_tokens", 32)
            )
        else:
            request_body = data.get("request")
            if not isinstance(request_body, dict):
                raise playground.PlaygroundError("The infer request must be a JSON object.")
            payload = request_body
        answer = playground.send(deployment, str(data.get("key") or ""), payload)
    except playground.PlaygroundError as exc:
        return _refused(str(exc))
    return JsonResponse(
        {"status": answer.status, "body": answer.body, "milliseconds": answer.milliseconds}
    )
