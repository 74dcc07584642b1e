"""Scale to zero at the gateway: hold a request for a sleeping deployment until it is awake.

A deployment scaled to zero keeps its route in the table, with no ready backend and the
deployment's id as the route's ``wake`` (:mod:`serving.gateway.table`). A request for such a
route is not refused: :meth:`Activator.hold` keeps it until a newer table gives the route a
backend that can take it (:meth:`Activator.changed`, called by the gateway on every table it
applies, wakes the requests held; nothing polls the table), and the gateway then passes it on
as any other. Meanwhile the activator asks for the wake, once when the first request is held
and again every :data:`WAKE_EVERY_SECONDS` while any stays held, twice over:

- ``HSET {prefix}:wake <deployment id> <unix time>``: the portal's periodic task reads this
  hash, the backstop that wakes the deployment even when the task below is lost;
- the Celery task ``portal.deployments.tasks.wake_deployment`` (:data:`WAKE_TASK`), sent by
  name (the gateway imports nothing of the portal) to the broker at ``CELERY_BROKER_URL``,
  else the gateway's Redis, on the queue ``CELERY_QUEUE``, else ``celery``. Only one gateway
  process in :data:`SENT_SECONDS` sends it: the one that set ``{prefix}:wake:sent:<id>``.

A Redis or broker that fails is logged, never the request's failure: it stays held.

Bounded: at most ``hold_max`` requests held per route in a process (one more is refused at
once), each for at most ``hold_seconds`` (then it times out); the gateway answers both with a
503 and ``Retry-After``. A caller that disconnects while held just leaves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis.asyncio as aioredis

log = logging.getLogger("serving.gateway.activator")

WAKE_TASK = "portal.deployments.tasks.wake_deployment"
DEFAULT_HOLD_MAX = 100
DEFAULT_HOLD_SECONDS = 120.0
#: How often the wake is asked for again while requests stay held.
WAKE_EVERY_SECONDS = 3.0
#: How long one process's sending of the wake task keeps the others from sending it.
SENT_SECONDS = 5
#: How often a held request looks whether its caller is still connected (aiohttp does not
#: cancel a handler whose caller left).
DISCONNECT_CHECK_SECONDS = 0.5
#: The longest a broker that does not answer may take of one wake.
SEND_TIMEOUT_SECONDS = 10.0

T = TypeVar("T")


class NotReleased(Exception):
    """A request not released: ``outcome`` is ``refused`` (too many held already),
    ``timed_out`` or ``disconnected`` (its caller left)."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


class Activator:
    """The requests a gateway process holds, by route, and the wakes it asks for."""

    def __init__(
        self,
        *,
        prefix: str = "gateway",
        client: aioredis.Redis | None = None,
        broker_url: str | None = None,
        queue: str = "celery",
        hold_max: int = DEFAULT_HOLD_MAX,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        held_gauge: Any = None,
        activations: Any = None,
    ) -> None:
        self.prefix = prefix
        #: Where the wake hash and the de-duplication keys go (None: not written).
        self.client = client
        #: The Celery broker the wake task goes to (None: no task is sent).
        self.broker_url = broker_url
        self.queue = queue
        self.hold_max = hold_max
        self.hold_seconds = hold_seconds
        #: prometheus_client's gauge of requests held and counter of outcomes (by ``outcome``).
        self.held_gauge = held_gauge
        self.activations = activations
        #: route path → requests held for it; route path → the event the next table sets.
        self.held: dict[str, int] = {}
        self._tables: dict[str, asyncio.Event] = {}
        #: deployment id → requests held for it, and the task asking for its wake meanwhile.
        self._held_for: dict[int, int] = {}
        self._wakers: dict[int, asyncio.Task[None]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._celery: Any = None

    def changed(self) -> None:
        """A new table was applied: every request held looks again whether it may go."""
        for path, event in list(self._tables.items()):
            event.set()
            self._tables[path] = asyncio.Event()

    async def hold(
        self,
        path: str,
        deployment_id: int,
        ready: Callable[[], T | None],
        gone: Callable[[], bool] = lambda: False,
    ) -> T:
        """Wait until ``ready()`` gives something (looked at again on every new table) and
        return it; ``gone()`` says the caller disconnected. Raises :class:`NotReleased`."""
        if self.held.get(path, 0) >= self.hold_max:
            self._count("refused")
            raise NotReleased("refused")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_seconds
        self._enter(path, deployment_id)
        try:
            look = True  # at first, and after each new table; not on the caller's checks
            while True:
                if look:
                    found = ready()
                    if found:
                        self._count("released")
                        return found
                if gone():
                    raise NotReleased("disconnected")
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._count("timed_out")
                    raise NotReleased("timed_out")
                event = self._tables.setdefault(path, asyncio.Event())
                try:
                    await asyncio.wait_for(event.wait(), min(remaining, DISCONNECT_CHECK_SECONDS))
                except TimeoutError:
                    look = False
                else:
                    look = True
        finally:
            self._leave(path, deployment_id)

    async def close(self) -> None:
        for waker in self._wakers.values():
            waker.cancel()
        self._wakers.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # --- the held counts ------------------------------------------------------------------------

    def _enter(self, path: str, deployment_id: int) -> None:
        self.held[path] = self.held.get(path, 0) + 1
        self._held_for[deployment_id] = self._held_for.get(deployment_id, 0) + 1
        if self.held_gauge is not None:
            self.held_gauge.inc()
        if deployment_id not in self._wakers:
            self._wakers[deployment_id] = asyncio.create_task(self._keep_waking(deployment_id))

    def _leave(self, path: str, deployment_id: int) -> None:
        if self.held_gauge is not None:
            self.held_gauge.dec()
        self.held[path] -= 1
        if not self.held[path]:
            del self.held[path]
            self._tables.pop(path, None)
        self._held_for[deployment_id] -= 1
        if not self._held_for[deployment_id]:
            del self._held_for[deployment_id]
            waker = self._wakers.pop(deployment_id, None)
            if waker is not None:
                waker.cancel()

    def _count(self, outcome: str) -> None:
        if self.activations is not None:
            self.activations.labels(outcome).inc()

    # --- asking for the wake --------------------------------------------------------------------

    async def _keep_waking(self, deployment_id: int) -> None:
        while True:
            try:
                await self.ask(deployment_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # a wake that failed must never stop the next one
                log.exception("asking for the wake of deployment %s failed", deployment_id)
            await asyncio.sleep(WAKE_EVERY_SECONDS)

    async def ask(self, deployment_id: int) -> None:
        """Write the wake into Redis and, unless another process just did, send the task."""
        send = True
        if self.client is not None:
            try:
                await self.client.hset(f"{self.prefix}:wake", str(deployment_id), time.time())
                first = await self.client.set(
                    f"{self.prefix}:wake:sent:{deployment_id}", 1, nx=True, ex=SENT_SECONDS
                )
                send = bool(first)
            except (aioredis.RedisError, OSError) as exc:
                # Without the marker, sending twice is the lesser harm: the task is idempotent.
                log.warning(
                    "Redis unavailable asking for deployment %s's wake: %s", deployment_id, exc
                )
        if not send or self.broker_url is None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="gateway-wake")
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.run_in_executor(self._executor, self._send, deployment_id),
                SEND_TIMEOUT_SECONDS,
            )
        except Exception as exc:  # a broker down, or any error of it, must not fail the request
            log.warning("could not send %s for deployment %s: %r", WAKE_TASK, deployment_id, exc)
        else:
            log.info("sent %s for deployment %s", WAKE_TASK, deployment_id)

    def _send(self, deployment_id: int) -> None:
        """In the executor's thread: Celery's publishing blocks."""
        if self._celery is None:
            import celery  # only a gateway that holds a request needs it

            app = celery.Celery("gateway", broker=self.broker_url)
            app.conf.broker_connection_timeout = 3
            app.conf.broker_connection_retry = False
            self._celery = app
        self._celery.send_task(
            WAKE_TASK,
            args=[deployment_id],
            queue=self.queue,
            retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5},
        )
