"""Following an instance's log without holding a web worker.

``GET /api/v1/instances/<id>/logs/?follow=1&since=<next>`` is a long poll: it answers as soon as
the log has lines after ``since``, else after about 20 s with none. Under the portal's ASGI
server (:mod:`portal.asgi`) the view checks access and reads once on its request thread, as any
view does; if there is nothing yet, it answers with a streaming response whose body waits on
the event loop (:func:`portal.deployments.runtime.logs.follow_log_async`) and is written once, when
lines come or the wait ends. The request's thread and database connection are let go before
the wait, so a hundred open follows cost a hundred sleeping coroutines, not a hundred threads.

Each web process caps the follows it holds open, per user and in all
(``LOG_FOLLOWS_PER_USER``, ``LOG_FOLLOWS_PER_PROCESS``); one past a cap is answered 429 with
``Retry-After``. A follow's slot is a lease that ends when its answer is written or its caller
leaves, and at the latest a little after the wait's end, so a response that was never sent
cannot keep its slot.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Hashable

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpResponseBase, StreamingHttpResponse
from rest_framework.exceptions import Throttled
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from portal.accounts.models import ApiToken
from portal.api.log_serializers import LogOut
from portal.deployments.runtime import logs as instance_logs
from portal.deployments.runtime.launchers.base import LogChunk

logger = logging.getLogger(__name__)

#: Seconds a caller refused for too many follows is asked to wait before trying again.
RETRY_AFTER_SECONDS = 5
#: How long past the wait's end a slot is kept at most (an answer being written).
_LEASE_MARGIN_SECONDS = 10.0


class FollowLimit(Throttled):
    default_detail = "Too many log follows are open."


class FollowSlots:
    """The follows one process holds open, as leases with an end: a slot is given back when
    its follow ends, or, if its response was never run, when its lease runs out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, tuple[Hashable, float]] = {}
        self._ids = itertools.count()

    def take(self, holder: Hashable, *, per_holder: int, total: int, seconds: float) -> int:
        """A lease for ``holder``, or :class:`FollowLimit` when a cap is reached."""
        now = time.monotonic()
        with self._lock:
            self._leases = {k: lease for k, lease in self._leases.items() if lease[1] > now}
            if len(self._leases) >= total:
                raise FollowLimit(
                    wait=RETRY_AFTER_SECONDS,
                    detail=f"This portal process is following {total} logs, its limit; "
                    "try again shortly.",
                )
            held = sum(1 for owner, _ in self._leases.values() if owner == holder)
            if held >= per_holder:
                raise FollowLimit(
                    wait=RETRY_AFTER_SECONDS,
                    detail=f"You are following {held} logs, the limit per user; "
                    "close one or try again shortly.",
                )
            lease = next(self._ids)
            self._leases[lease] = (holder, now + seconds)
            return lease

    def give_back(self, lease: int) -> None:
        with self._lock:
            self._leases.pop(lease, None)

    def held(self) -> int:
        now = time.monotonic()
        with self._lock:
            return sum(1 for _, end in self._leases.values() if end > now)


SLOTS = FollowSlots()


def waits_on_event_loop(request: Request) -> bool:
    """Whether this request came through the ASGI server, where a wait can be a coroutine."""
    return isinstance(request._request, ASGIRequest)


def follow_answer(request: Request, instance, *, since: str, tail: int) -> HttpResponseBase:
    """The answer to a follow under ASGI: the lines after ``since`` at once if there are any
    (or the log has ended), else a response that waits for them off the request's thread.
    Raises ``LogCursorError`` for a bad ``since`` (from the first read, before any wait)."""
    source = instance_logs.instance_log_source(instance)
    if source is None:
        return Response(_body(LogChunk([], since, ended=True)))
    chunk = source.read(since=since, tail=tail)
    if chunk.lines or chunk.ended:
        return Response(_body(chunk))
    wait = instance_logs.FOLLOW_WAIT_SECONDS
    lease = SLOTS.take(
        _holder(request),
        per_holder=settings.LOG_FOLLOWS_PER_USER,
        total=settings.LOG_FOLLOWS_PER_PROCESS,
        seconds=wait + _LEASE_MARGIN_SECONDS,
    )
    if not connection.in_atomic_block:
        connection.close()  # the wait needs none; the request's thread would keep it open
    response = StreamingHttpResponse(
        _answer_when_ready(source, since=chunk.next, tail=tail, wait=wait, lease=lease),
        content_type="application/json",
    )
    response["Cache-Control"] = "no-store"
    return response


async def _answer_when_ready(
    source: instance_logs.InstanceLogSource, *, since: str, tail: int, wait: float, lease: int
) -> AsyncIterator[bytes]:
    try:
        try:
            chunk = await instance_logs.follow_log_async(
                source, since=since, tail=tail, wait_seconds=wait
            )
        except Exception:
            # The status is sent already. No lines and the same cursor: the caller asks again,
            # and that call's first read, on the request's thread, answers the error as such.
            logger.exception("Following the log of instance %s failed", source.name)
            chunk = LogChunk([], since, ended=False)
        yield JSONRenderer().render(_body(chunk))
    finally:
        SLOTS.give_back(lease)


def _holder(request: Request) -> Hashable:
    """Whose follow this is: an API token's (a token acts for its team, not for the person who
    made it), else the signed-in person's."""
    if isinstance(request.auth, ApiToken):
        return ("token", request.auth.pk)
    return ("user", request.user.pk)


def _body(chunk: LogChunk) -> dict:
    return LogOut({"lines": chunk.lines, "next": chunk.next, "ended": chunk.ended}).data
