"""An ASGI middleware that refuses a request body over a size, before the application reads it.

Django's ASGI handler reads a request's whole body, spooling it to disk, before any view or
``DATA_UPLOAD_MAX_MEMORY_SIZE`` looks at it; under WSGI a view could refuse by the declared
length first. The portal's ASGI application (:mod:`portal.asgi`) sits behind this.
"""

from __future__ import annotations

import json

from portal.api.errors import error_body


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413 and never reaches
    the application whole."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        seen = 0
        refused = False

        async def counted_receive():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Answer now; the application sees a caller that left and answers nothing.
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        return await self.app(scope, counted_receive, send)

    async def _refuse(self, send) -> None:
        body = json.dumps(
            error_body(
                "request_too_large",
                f"The request body is larger than the limit of {self.max_bytes} bytes.",
            )
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
