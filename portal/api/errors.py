"""One error body for every API failure::

    {"error": {"code": "invalid", "message": "...", "fields": {"name": ["..."]}}}

``fields`` is present when specific input fields are at fault.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.core.errors import ApplicationError


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    body: dict = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return {"error": body}


def _flatten(detail) -> dict[str, list[str]]:
    """DRF's nested error detail → ``{"field.sub": ["message", ...]}``."""
    out: dict[str, list[str]] = {}

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")
        else:
            messages = value if isinstance(value, list) else [value]
            out.setdefault(path or "non_field_errors", []).extend(str(m) for m in messages)

    walk(detail, "")
    return out


def _summary(fields: dict[str, list[str]]) -> str:
    name, messages = next(iter(fields.items()))
    prefix = "" if name == "non_field_errors" else f"{name}: "
    more = f" (and {len(fields) - 1} more field(s))" if len(fields) > 1 else ""
    return f"{prefix}{messages[0]}{more}"


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        detail = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        fields = {k: list(v) for k, v in detail.items()}
        return Response(error_body("invalid", _summary(fields), fields), status=400)
    if isinstance(exc, ApplicationError):
        body = error_body(exc.code, exc.message)
        if exc.detail:
            body["error"]["detail"] = exc.detail
        return Response(body, status=exc.status_code)
    if isinstance(exc, RequestDataTooBig):
        # Django refuses the body from its Content-Length before reading it (or once a body
        # without one passes the limit); its own answer would be a bare 400.
        return Response(_too_large(), status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        response.data = error_body("invalid", _summary(fields), fields)
    elif isinstance(exc, exceptions.ParseError):
        response.data = error_body("malformed_request", str(exc.detail))
    elif isinstance(exc, exceptions.APIException):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        response.data = error_body(str(code), str(exc.detail))
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 handler: a URL under /api/ that no route matches (``/versions/0.5/``, a
    mistyped action) is answered like any other API 404, in JSON; pages keep the HTML one."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 400 handler, for what fails before a view can answer; under /api/ in JSON, and
    a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` as the 413 it is."""
    if not request.path.startswith("/api/"):
        return defaults.bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        return JsonResponse(_too_large(), status=413)
    return JsonResponse(error_body("bad_request", "Bad request."), status=400)


def _too_large() -> dict:
    """The one answer to a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``, whether DRF or Django
    found it first."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return error_body(
        "request_too_large", f"The request body is larger than the limit of {limit} bytes."
    )
