"""The gateway's request path: pick a backend by the route's weights, pass the request through.

A request to ``/models/<team>/<model>/[versions/<n>/]<rest>`` goes to one backend of that
route: ``v2/...`` to its KServe v2 HTTP server, the OpenAI routes (``chat/completions``, or the
older ``v1/chat/completions``) to its OpenAI front end (:func:`upstream_of`). The version
group is picked by smooth weighted round-robin, so a 25/75 split is exact over every four
requests, and a backend inside the group by round-robin.

Only a failure to *connect* is retried, on another backend: the request has then reached no
model. Anything later (the backend closed the connection mid-request, a broken response) is a
502, never a second try: inference is not free to repeat, and a streamed answer may already be
on its way to the caller. Requests already passed to a backend run to completion whatever the
table becomes meanwhile; a backend that leaves the table only stops getting new ones.

A route with no ready backend is answered 503 at once, unless its deployment is scaled to zero
(the route names a deployment to ``wake``): the request is then held until a table gives the
route a backend, and the deployment is asked to wake meanwhile (:mod:`serving.gateway.activator`);
a request held too long, or one more than a route may have held, is answered 503 with
``Retry-After``.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, multiprocess

from serving.gateway.activator import Activator, NotReleased
from serving.gateway.keys import KeyTable, Refused, estimate_tokens, presented_key
from serving.gateway.observations import GatewayObservations, is_inference
from serving.gateway.ratelimit import LimitsUnavailable, RateLimiter, buckets
from serving.gateway.supervisor import MULTIPROCESS_DIR_VARIABLE
from serving.gateway.table import Backend, Group, RouteEntry
from serving.request_limits import DEFAULT_MAX_BODY_BYTES

#: Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus those aiohttp sets.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # The caller's key is the gateway's to check; an instance never sees it.
        "authorization",
        "x-api-key",
    }
)
MAX_CONNECT_ATTEMPTS = 3
#: What a request held for a deployment scaled to zero, and not released, is told to wait.
WAKE_RETRY_AFTER_SECONDS = 10


@dataclass
class RouteState:
    """A route's table entry and where its round-robins stand."""

    entry: RouteEntry
    current: dict[str, int] = field(default_factory=dict)
    turns: dict[str, itertools.count] = field(default_factory=dict)

    def groups(self) -> list[Group]:
        return [g for g in self.entry.groups if g.weight > 0 and g.backends]

    def pick_group(self, groups: list[Group]) -> Group:
        """Smooth weighted round-robin (as nginx does): exact proportions, evenly spread."""
        total = sum(g.weight for g in groups)
        best = None
        for group in groups:
            self.current[group.label] = self.current.get(group.label, 0) + group.weight
            if best is None or self.current[group.label] > self.current[best.label]:
                best = group
        assert best is not None
        self.current[best.label] -= total
        return best

    def pick_backend(self, group: Group) -> Backend:
        turn = next(self.turns.setdefault(group.label, itertools.count()))
        return group.backends[turn % len(group.backends)]

    def candidates(self) -> list[tuple[Group, Backend]]:
        """The chosen backend first, then the rest of its group, then the other groups'."""
        groups = self.groups()
        if not groups:
            return []
        group = self.pick_group(groups)
        first = self.pick_backend(group)
        order = [(group, first)]
        order += [(group, b) for b in group.backends if b is not first]
        order += [(g, b) for g in groups if g is not group for b in g.backends]
        return order


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by route and status code",
            ["route", "code"],
            registry=self.registry,
        )
        self.retries = Counter(
            "gateway_connect_retries",
            "Requests sent to another backend after a failed connection",
            ["route"],
            registry=self.registry,
        )
        self.limits_unavailable = Counter(
            "gateway_rate_limits_unavailable",
            "Requests passed without their rate limits applied because Redis did not answer",
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors",
            "Requests that failed after reaching a backend (answered 502)",
            ["route"],
            registry=self.registry,
        )
        # Under the supervisor, every process writes its values to files that /metrics sums
        # (prometheus_client's multiprocess mode); a gauge then takes these modes over the
        # processes alive: all requests in flight, the oldest table applied.
        self.in_flight = Gauge(
            "gateway_in_flight",
            "Requests being proxied",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.generation = Gauge(
            "gateway_table_generation",
            "Routing table generation applied",
            registry=self.registry,
            multiprocess_mode="livemin",
        )
        self.held = Gauge(
            "gateway_held_requests",
            "Requests held for a deployment scaled to zero, until it has a ready instance",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.activations = Counter(
            "gateway_activations",
            "Requests for a deployment scaled to zero, by how their hold ended: released (a "
            "table gave the route an instance, or changed it), timed out, or refused at once "
            "because the route had too many held",
            ["outcome"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """This process's metrics, or, under the supervisor, those of every gateway process."""
        if not os.environ.get(MULTIPROCESS_DIR_VARIABLE):
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)
        return generate_latest(merged)


class Gateway:
    """The routing table and caller keys in use, and the handler that applies them."""

    def __init__(
        self,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        limiter: RateLimiter | None = None,
        prefix: str = "gateway",
        activator: Activator | None = None,
    ) -> None:
        #: Bodies over this are answered 413 and never forwarded.
        self.max_body_bytes = max_body_bytes
        self.generation = 0
        self.routes: dict[str, RouteState] = {}
        #: The caller keys accepted (:mod:`serving.gateway.keys`); none until the portal
        #: publishes some, so a gateway with no key set refuses every call.
        self.keys = KeyTable()
        #: Applies rate limits (None: none are applied, for a gateway without Redis).
        self.limiter = limiter
        self.prefix = prefix
        self.metrics = Metrics()
        #: route path → time of its last request, flushed to Redis by the table follower.
        self.seen: dict[str, float] = {}
        #: key prefix → time of its last accepted request, flushed the same way.
        self.keys_used: dict[str, float] = {}
        #: KServe inference requests observed for the canary analysis, flushed the same way.
        self.observations = GatewayObservations.from_env()
        self.session: aiohttp.ClientSession | None = None
        #: Holds the requests for a deployment scaled to zero (one that asks for no wake when
        #: none is given: the tests' and a gateway's without Redis).
        self.activator = activator or Activator(prefix=prefix)
        self.activator.held_gauge = self.metrics.held
        self.activator.activations = self.metrics.activations

    def apply(self, generation: int, entries: list[RouteEntry]) -> None:
        """Swap in a new table; a route that stays keeps its round-robin positions."""
        routes = {}
        for entry in entries:
            state = self.routes.get(entry.path)
            routes[entry.path] = RouteState(
                entry,
                state.current if state else {},
                state.turns if state else {},
            )
        self.routes, self.generation = routes, generation
        self.metrics.generation.set(generation)
        self.activator.changed()

    def apply_keys(self, keys: KeyTable) -> None:
        self.keys = keys

    async def start(self, app: web.Application) -> None:
        # A new connection per request: then a failure to connect is the only failure that
        # proves the request reached no instance, which is what makes a retry safe. A pooled
        # keep-alive connection to an instance that just died fails *after* the request is
        # written, indistinguishable from an instance dying mid-request.
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_connect=5),
            auto_decompress=False,
        )

    async def stop(self, app: web.Application) -> None:
        await self.activator.close()
        if self.session is not None:
            await self.session.close()

    # --- handlers -----------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"generation": self.generation, "routes": len(self.routes)})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        path, rest = split_path(request.match_info["tail"])
        kserve = rest.startswith("v2/")
        # The key first: a caller without one learns nothing, not even which models exist.
        try:
            caller = self.keys.authenticate(
                presented_key(
                    request.headers.get("Authorization"), request.headers.get("X-API-Key")
                ),
                path,
            )
        except Refused as refused:
            response = self._error(
                path, refused.status, refused.message, refused.kind, kserve=kserve
            )
            if refused.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="models"'
            return response
        state = self.routes.get(path)
        if state is None:
            return self._error(
                path, 404, f"No model is served at /models/{path}/.", "not_found", kserve=kserve
            )
        kind, upstream_path = upstream_of(rest)
        if not kind:
            return self._error(
                path,
                404,
                f"/models/{path}/ is the model's base URL: the OpenAI routes (chat/completions, "
                "completions, embeddings, models) and KServe v2's (v2/...) are under it.",
                "not_found",
                kserve=kserve,
            )
        candidates = [(g, b) for g, b in state.candidates() if getattr(b, kind)]
        if not candidates and state.entry.wake is not None:
            # Scaled to zero: wait for an instance, then go on as any other request.
            try:
                found = await self.activator.hold(
                    path,
                    state.entry.wake,
                    lambda: self._released(path, kind),
                    lambda: request.transport is None or request.transport.is_closing(),
                )
            except NotReleased as stopped:
                return self._not_released(path, stopped.outcome, kserve=kserve)
            released, candidates = found
            if released is None:
                return self._error(
                    path, 404, f"No model is served at /models/{path}/.", "not_found", kserve=kserve
                )
        if not candidates:
            return self._error(
                path, 503, f"no ready instance for route {path}", "unavailable", kserve=kserve
            )
        self.seen[path] = time.time()
        too_large = (
            f"the request body is larger than the gateway's limit of {self.max_body_bytes} bytes"
        )
        if (request.content_length or 0) > self.max_body_bytes:
            return self._error(path, 413, too_large, "request_too_large", kserve=kserve)
        try:
            body = await request.read()  # aiohttp stops at client_max_size (chunked bodies)
        except web.HTTPRequestEntityTooLarge:
            return self._error(path, 413, too_large, "request_too_large", kserve=kserve)
        wanted = buckets(caller, estimate_tokens(body), self.prefix) if self.limiter else []
        if wanted:
            assert self.limiter is not None
            try:
                verdict = await self.limiter.take(wanted)
            except LimitsUnavailable:
                self.metrics.limits_unavailable.inc()
            else:
                if not verdict.allowed:
                    limited = self._error(
                        path,
                        429,
                        "Rate limit reached for this key or its team; retry after "
                        f"{verdict.retry_after_header} s.",
                        "rate_limit_exceeded",
                        kserve=kserve,
                    )
                    limited.headers["Retry-After"] = verdict.retry_after_header
                    return limited
        self.keys_used[caller.key.prefix] = time.time()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        observed = (
            time.monotonic()
            if kind == "kserve_http"
            and is_inference(request.method, upstream_path)
            and self.observations.wanted()
            else None
        )
        self.metrics.in_flight.inc()
        try:
            return await self._forward(
                request, path, upstream_path, kind, candidates, headers, body, observed
            )
        finally:
            self.metrics.in_flight.dec()

    def _released(
        self, path: str, kind: str
    ) -> tuple[RouteState | None, list[tuple[Group, Backend]]] | None:
        """For a held request, on each new table: the route's candidates, once it has some;
        (None, []) when the route left the table, (state, []) when it no longer names a
        deployment to wake (the request is no longer held, and is answered as any other);
        None: still waiting."""
        state = self.routes.get(path)
        if state is None:
            return None, []
        candidates = [(g, b) for g, b in state.candidates() if getattr(b, kind)]
        if candidates or state.entry.wake is None:
            return state, candidates
        return None

    def _not_released(self, path: str, outcome: str, *, kserve: bool) -> web.Response:
        if outcome == "disconnected":  # nobody reads it: counted as nginx counts these
            self.metrics.requests.labels(path, "499").inc()
            return web.Response(status=499)
        why = (
            f"waited {self.activator.hold_seconds:g} s"
            if outcome == "timed_out"
            else "too many requests are already waiting for it"
        )
        response = self._error(
            path,
            503,
            f"The model at /models/{path}/ is scaled to zero and starting ({why}); retry after "
            f"{WAKE_RETRY_AFTER_SECONDS} s.",
            "unavailable",
            kserve=kserve,
        )
        response.headers["Retry-After"] = str(WAKE_RETRY_AFTER_SECONDS)
        return response

    async def _forward(
        self,
        request: web.Request,
        path: str,
        rest: str,
        kind: str,
        candidates: list[tuple[Group, Backend]],
        headers: dict[str, str],
        body: bytes,
        observed: float | None = None,
    ) -> web.StreamResponse:
        """``observed``: when the request came in, if it is to be observed."""
        assert self.session is not None
        for attempt, (group, backend) in enumerate(candidates[:MAX_CONNECT_ATTEMPTS]):
            url = f"{getattr(backend, kind)}/{rest}"
            try:
                upstream = await self.session.request(
                    request.method,
                    url,
                    params=request.query,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                )
            except aiohttp.ClientConnectorError:
                if attempt + 1 < min(len(candidates), MAX_CONNECT_ATTEMPTS):
                    self.metrics.retries.labels(path).inc()
                    continue
                return self._error(
                    path,
                    503,
                    f"no instance of route {path} accepted the connection",
                    "unavailable",
                    kserve=kind == "kserve_http",
                )
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.metrics.upstream_errors.labels(path).inc()
                self._observe(path, group, 502, observed)
                return self._error(
                    path,
                    502,
                    f"instance {backend.name} failed: {exc!r}",
                    "upstream_error",
                    kserve=kind == "kserve_http",
                )
            return await self._relay(request, path, group, backend, upstream, observed)
        raise AssertionError("unreachable: candidates is not empty")

    async def _relay(
        self,
        request: web.Request,
        path: str,
        group: Group,
        backend: Backend,
        upstream: aiohttp.ClientResponse,
        observed: float | None = None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status)
        for name, value in upstream.headers.items():
            if name.lower() not in HOP_BY_HOP:
                response.headers.add(name, value)
        response.headers["X-Served-By"] = backend.name
        response.headers["X-Served-Version"] = group.label
        try:
            async with upstream:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.metrics.upstream_errors.labels(path).inc()
            self._observe(path, group, 502, observed)
            if not response.prepared:
                return self._error(
                    path,
                    502,
                    f"instance {backend.name} failed: {exc!r}",
                    "upstream_error",
                    kserve=split_path(request.match_info["tail"])[1].startswith("v2/"),
                )
            # The answer broke off after it began: the caller's connection is cut too, as it
            # would be by the instance itself, so a partial body never looks complete. It is
            # never replayed elsewhere.
            self.metrics.requests.labels(path, "502").inc()
            if request.transport is not None:
                request.transport.abort()
            return response
        await response.write_eof()
        self.metrics.requests.labels(path, str(upstream.status)).inc()
        self._observe(path, group, upstream.status, observed)
        return response

    def _observe(self, path: str, group: Group, status: int, observed: float | None) -> None:
        if observed is not None:
            self.observations.add(path, group.label, status, observed)

    def _error(
        self, path: str, status: int, message: str, kind: str, *, kserve: bool = False
    ) -> web.Response:
        """An answer of the gateway's own, in the shape the caller's protocol uses: OpenAI's
        ``{"error": {"message", "type"}}``, or KServe v2's ``{"error": message}`` under
        ``v2/`` (tritonclient reads that string as the error's message)."""
        self.metrics.requests.labels(path, str(status)).inc()
        body: dict[str, object] = (
            {"error": message} if kserve else {"error": {"message": message, "type": kind}}
        )
        return web.json_response(body, status=status)


def upstream_of(rest: str) -> tuple[str, str]:
    """Which server of an instance takes ``rest`` (the path under a route) and at what path:
    ``v2/...`` is KServe v2 (tritonclient writes that prefix itself); the OpenAI routes sit
    right under the route (``chat/completions`` → the front end's ``v1/chat/completions``), so a
    deployment's base URL carries no ``v1`` that reads like a version; ``v1/...`` is still taken
    as it is, the base URL's form before. ("", "") for the base URL itself."""
    if rest.startswith("v2/"):
        return "kserve_http", rest
    if rest.startswith("v1/"):
        return "openai", rest
    if rest:
        return "openai", f"v1/{rest}"
    return "", ""


def split_path(tail: str) -> tuple[str, str]:
    """``team/model/versions/3/v1/chat`` → (``team/model/versions/3``, ``v1/chat``)."""
    parts = tail.split("/")
    cut = 4 if len(parts) > 4 and parts[2] == "versions" else 2
    return "/".join(parts[:cut]), "/".join(parts[cut:])


def make_app(gateway: Gateway) -> web.Application:
    """What callers reach. ``/metrics`` is not here: it names every team's routes and models,
    so it is served on a port of its own (:func:`make_metrics_app`)."""
    app = web.Application(client_max_size=gateway.max_body_bytes)
    app.router.add_get("/healthz", gateway.healthz)
    app.router.add_route("*", "/models/{tail:.+}", gateway.proxy)
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    return app


def make_metrics_app(gateway: Gateway) -> web.Application:
    """``/metrics`` alone, for the metrics port (``--metrics-port``), which a cluster's
    scrapers reach and its load balancer does not expose."""
    app = web.Application()
    app.router.add_get("/metrics", gateway.metrics_page)
    return app
