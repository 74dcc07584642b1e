"""The caller keys every gateway checks, published by the portal in Redis beside the routing table.

A caller of a model presents a key (``Authorization: Bearer mlk_…`` as the OpenAI client sends
it, or ``X-API-Key: mlk_…``, which tritonclient and KServe clients pass as a header). The
gateway never asks the database: the portal publishes the whole set of active keys, as SHA-256
digests, whenever one is created, changed or revoked (and beat again every minute), and each
gateway swaps in a new set as soon as it sees the counter move (it checks every 100 ms). So a
revocation is in force at every gateway within about a second; an expiry needs no publication
(each entry carries its time).

Keys under ``prefix`` (the routing table's, default ``gateway``):

- ``{prefix}:keys``: JSON ``{"keys": [...], "teams": {...}}`` (:func:`document`);
- ``{prefix}:keys:generation``: a counter moved on every publication
  (:func:`.table.next_generation`);
- ``{prefix}:key_last_used``: hash of key prefix → Unix time of its last accepted request.

A key is scoped to one team's models: all of them, or a list of model slugs. Limits (requests
per second and tokens per minute) may be set per key and per team; the gateway enforces them
with :mod:`serving.gateway.ratelimit`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from serving.gateway import table

SCHEME = "mlk"
#: Without ``max_tokens`` a request may generate up to its context; the token limit counts this
#: many for the answer (a request that names ``max_tokens`` is counted by it).
DEFAULT_COMPLETION_TOKENS = 256
#: The prompt's tokens are estimated from its bytes before it is tokenized (one token for about
#: four bytes of English text, as OpenAI's own guidance has it).
BYTES_PER_TOKEN = 4


class KeyTableError(ValueError):
    """A published key set that does not have the expected shape."""


@dataclass(frozen=True)
class Limits:
    """Rate limits; None means none."""

    requests_per_second: float | None = None
    tokens_per_minute: int | None = None

    @property
    def any(self) -> bool:
        return self.requests_per_second is not None or self.tokens_per_minute is not None


@dataclass(frozen=True)
class KeyEntry:
    """One active key as gateways know it: its digest, never its plaintext."""

    prefix: str
    digest: str
    team: str
    #: Model slugs of ``team`` the key may call; None for all of the team's models.
    models: tuple[str, ...] | None = None
    expires_at: float | None = None
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, once its key checked out."""

    key: KeyEntry
    team_limits: Limits


class Refused(Exception):
    """A request the gateway answers itself: ``status`` 401 (no or bad key) or 403 (a key not
    scoped to the model)."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def split_key(plaintext: str) -> str | None:
    """The public prefix of a well-formed key (``mlk_<prefix>_<secret>``), else None."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != SCHEME or not parts[1] or not parts[2]:
        return None
    return parts[1]


def document(keys: list[KeyEntry], team_limits: dict[str, Limits]) -> str:
    """The published form of a key set (what :func:`parse` reads back)."""
    return json.dumps(
        {
            "keys": [
                {**asdict(k), "models": list(k.models) if k.models is not None else None}
                for k in sorted(keys, key=lambda k: k.prefix)
            ],
            "teams": {slug: asdict(limits) for slug, limits in sorted(team_limits.items())},
        },
        sort_keys=True,
    )


def publish(client: redis.Redis, text: str, prefix: str = "gateway") -> int:
    """Replace the key set with ``text`` (from :func:`document`); returns the new counter. The
    caller serializes publications (the portal holds a lock and builds ``text`` inside it)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.set(f"{prefix}:keys", text)
        table.next_generation(pipe, f"{prefix}:keys:generation")
        _, generation = pipe.execute()
    return int(generation)


def parse(raw: str | bytes) -> KeyTable:
    try:
        data = json.loads(raw)
        keys = [_entry(item) for item in data["keys"]]
        teams = {str(slug): _limits(value) for slug, value in data["teams"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyTableError(f"malformed key set: {exc!r}") from exc
    return KeyTable(keys, teams)


def _entry(item: dict[str, Any]) -> KeyEntry:
    models = item["models"]
    if models is not None and not (
        isinstance(models, list) and all(isinstance(m, str) for m in models)
    ):
        raise KeyTableError(f"bad model list {models!r}")
    expires_at = item["expires_at"]
    return KeyEntry(
        prefix=str(item["prefix"]),
        digest=str(item["digest"]),
        team=str(item["team"]),
        models=tuple(models) if models is not None else None,
        expires_at=float(expires_at) if expires_at is not None else None,
        limits=_limits(item["limits"]),
    )


def _limits(value: dict[str, Any]) -> Limits:
    rps, tpm = value["requests_per_second"], value["tokens_per_minute"]
    if rps is not None and not (isinstance(rps, int | float) and rps > 0):
        raise KeyTableError(f"bad requests_per_second {rps!r}")
    if tpm is not None and not (isinstance(tpm, int) and tpm > 0):
        raise KeyTableError(f"bad tokens_per_minute {tpm!r}")
    return Limits(float(rps) if rps is not None else None, tpm)


class KeyTable:
    """The keys a gateway process accepts, by prefix."""

    def __init__(
        self, keys: list[KeyEntry] | None = None, teams: dict[str, Limits] | None = None
    ) -> None:
        self.keys = {k.prefix: k for k in keys or []}
        self.teams = teams or {}

    def authenticate(self, presented: str | None, route: str) -> Caller:
        """The caller of ``route`` (``team/model[/versions/n]``) presenting ``presented``;
        raises :class:`Refused` saying why not."""
        if not presented:
            raise Refused(
                401,
                "A caller key is required: send 'Authorization: Bearer <key>' (create keys on "
                "the portal's Caller keys page).",
                "invalid_api_key",
            )
        prefix = split_key(presented)
        entry = self.keys.get(prefix) if prefix else None
        if entry is None or not hmac.compare_digest(entry.digest, digest(presented)):
            # Unknown, revoked (no longer published) and mistyped keys read the same.
            raise Refused(401, "The caller key is not valid.", "invalid_api_key")
        if entry.expires_at is not None and entry.expires_at <= time.time():
            raise Refused(401, "The caller key has expired.", "invalid_api_key")
        team, _, rest = route.partition("/")
        model = rest.partition("/")[0]
        if team != entry.team or (entry.models is not None and model not in entry.models):
            raise Refused(
                403, f"This key may not call the model {team}/{model}.", "permission_denied"
            )
        return Caller(entry, self.teams.get(entry.team, Limits()))


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key in a request's headers: a Bearer ``Authorization`` or ``X-API-Key``."""
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return api_key.strip() if api_key and api_key.strip() else None


def estimate_tokens(body: bytes) -> int:
    """What a request counts against a tokens-per-minute limit, known before it runs: its
    prompt estimated from the body's size, plus the answer's ``max_tokens`` (OpenAI's
    ``max_tokens``/``max_completion_tokens`` times ``n``, or KServe generate's
    ``parameters.max_tokens``), :data:`DEFAULT_COMPLETION_TOKENS` when it names none. The same
    reservation-based count as hosted APIs make: nothing is refunded afterwards."""
    prompt = math.ceil(len(body) / BYTES_PER_TOKEN)
    answer = DEFAULT_COMPLETION_TOKENS
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):  # not JSON (a binary KServe body), or nested too deep
        data = None
    if isinstance(data, dict):
        parameters = data.get("parameters")
        named = (
            data.get("max_completion_tokens")
            or data.get("max_tokens")
            or (parameters.get("max_tokens") if isinstance(parameters, dict) else None)
        )
        if isinstance(named, int) and named > 0:
            answer = named
        n = data.get("n")
        if isinstance(n, int) and n > 1:
            answer *= n
    return prompt + answer
