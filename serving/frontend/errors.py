"""OpenAI-style errors: every refusal names the parameter, so a caller can fix its request.

The body is ``{"error": {"message", "type", "param", "code"}}`` as OpenAI (and the ``openai``
client's ``BadRequestError.body``) expect it.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class OpenAIError(Exception):
    """A request the front end answers with an error status instead of a completion."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None, code: str = "invalid_parameter") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, why: str = "is not supported by this platform") -> OpenAIError:
    return OpenAIError(400, f"{param} {why}", param=param, code="unsupported_parameter")


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist.",
        param="model",
        code="model_not_found",
    )


def engine_unavailable(message: str) -> OpenAIError:
    return OpenAIError(503, message, type="service_unavailable", code="engine_unavailable")


def _param(loc: tuple[Any, ...]) -> str:
    """``("body", "messages", 0, "role")`` → ``messages[0].role``."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def limit_error_body(status: int, message: str) -> bytes:
    """The body :class:`serving.request_limits.BoundedBody` answers with: too large (413) or not
    parseable at all (400: not UTF-8, nested too deep)."""
    code = "request_too_large" if status == 413 else "invalid_request_body"
    return json.dumps(OpenAIError(status, message, code=code).body()).encode()


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """A bug answers in the API's shape and says nothing of the code: the traceback goes to the
    log (uvicorn logs it as the exception leaves the app), never to the caller."""
    error = OpenAIError(500, "internal server error", type="server_error", code="internal_error")
    return JSONResponse(error.body(), status_code=500)


async def openai_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Pydantic's first error, as one OpenAI error naming the field (unknown fields included:
    the request models forbid extras, so a parameter this platform does not know is refused)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if not errors:
        return JSONResponse(bad_request("invalid request body", None).body(), status_code=400)
    first = errors[0]
    param = _param(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        error = OpenAIError(
            400,
            f"{param} is not a parameter this platform knows; it was refused rather than ignored",
            param=param,
            code="unknown_parameter",
        )
    else:
        error = bad_request(f"{param}: {first.get('msg', 'invalid value')}", param)
    return JSONResponse(error.body(), status_code=400)
