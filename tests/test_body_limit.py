"""portal.core.body_limit: the limit in front of Django's ASGI handler, which would otherwise spool
any body whole (to disk past 2.5 MB) before a view or a limit looks at it."""

from __future__ import annotations

import asyncio
import json

from portal.core.body_limit import BodyLimit

LIMIT = 1000


class Recorder:
    """An inner application that reads the whole body, as Django's handler does, and answers
    200 with how much it read; or notes that its caller left."""

    def __init__(self) -> None:
        self.read = 0
        self.saw_disconnect = False

    async def __call__(self, scope, receive, send):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.saw_disconnect = True
                return
            self.read += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(self.read).encode()})


def call(chunks: list[bytes], headers: list[tuple[bytes, bytes]]):
    inner = Recorder()
    sent: list[dict] = []
    pending = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    pulled = 0

    async def receive():
        nonlocal pulled
        pulled += 1
        return pending.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/v1/models/", "headers": headers}
    asyncio.run(BodyLimit(inner, LIMIT)(scope, receive, send))
    return inner, sent, pulled


def test_a_declared_length_over_the_limit_is_refused_before_any_body_is_read():
    inner, sent, pulled = call([b"x" * 10], [(b"content-length", str(LIMIT + 1).encode())])
    assert pulled == 0 and inner.read == 0
    assert sent[0]["status"] == 413
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == "request_too_large"
    assert str(LIMIT) in body["error"]["message"]


def test_a_chunked_body_is_refused_once_it_passes_the_limit_and_no_more_is_read():
    chunks = [b"x" * 400] * 10  # no Content-Length: counted as it arrives
    inner, sent, pulled = call(chunks, [(b"transfer-encoding", b"chunked")])
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [413]
    assert pulled == 3, "read on past the limit"
    assert inner.saw_disconnect and inner.read == 800


def test_a_body_within_the_limit_reaches_the_application_whole():
    inner, sent, _ = call([b"x" * 500, b"y" * 500], [(b"content-length", b"1000")])
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"1000"
    assert inner.read == LIMIT and not inner.saw_disconnect
