"""Token buckets in Redis, shared by every gateway process and every gateway.

A limit of R requests per second is a bucket of R tokens (at least 1) refilled at R per second,
each request taking one; T tokens per minute is a bucket of T refilled at T/60 per second, each
request taking its estimated tokens (:func:`serving.gateway.keys.estimate_tokens`; a request
estimated above a whole bucket waits for a full one and empties it). A request passes only if
every bucket that applies to it (its key's and its team's) has what it takes; then it takes it
from all of them at once, in one Lua script, on Redis's clock. Otherwise nothing is taken and the
caller is told how long until it would pass: 429 with ``Retry-After``.

One round trip per limited request (a key and team without limits cost nothing). When Redis
cannot be reached the request passes (logged and counted): the limits protect capacity, and
losing Redis must not take every model down with it, as it does not take routing down.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from serving.gateway.keys import Caller

log = logging.getLogger("serving.gateway")

# KEYS: one bucket per limit. ARGV: for each, capacity, refill per second, cost.
# Returns 0 when the request passes (and was taken from every bucket), else the seconds to wait.
_TAKE = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1e6
local levels = {}
local wait = 0
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[3 * i - 2])
  local rate = tonumber(ARGV[3 * i - 1])
  local cost = math.min(tonumber(ARGV[3 * i]), capacity)
  local state = redis.call('HMGET', key, 'level', 'at')
  local level = capacity
  if state[1] then
    level = math.min(capacity, tonumber(state[1]) + (now - tonumber(state[2])) * rate)
  end
  levels[i] = level - cost
  if level < cost then
    wait = math.max(wait, (cost - level) / rate)
  end
end
if wait > 0 then
  return tostring(wait)
end
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[3 * i - 2])
  local rate = tonumber(ARGV[3 * i - 1])
  redis.call('HSET', key, 'level', tostring(levels[i]), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil(capacity / rate * 1000) + 1000)
end
return '0'
"""


@dataclass(frozen=True)
class Bucket:
    key: str
    capacity: float
    rate: float  # per second
    cost: float


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: float = 0.0

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, rounded up (``Retry-After`` takes no fractions)."""
        return str(max(1, math.ceil(self.retry_after)))


def buckets(caller: Caller, tokens: int, prefix: str = "gateway") -> list[Bucket]:
    """The buckets a request of ``caller`` estimated at ``tokens`` takes from."""
    found = []
    for scope, limits in (
        (f"key:{caller.key.prefix}", caller.key.limits),
        (f"team:{caller.key.team}", caller.team_limits),
    ):
        rps = limits.requests_per_second
        if rps is not None:
            found.append(Bucket(f"{prefix}:rate:{scope}:requests", max(1.0, rps), rps, 1))
        tpm = limits.tokens_per_minute
        if tpm is not None:
            found.append(Bucket(f"{prefix}:rate:{scope}:tokens", tpm, tpm / 60, tokens))
    return found


class RateLimiter:
    def __init__(self, client: aioredis.Redis) -> None:
        self.script = client.register_script(_TAKE)

    async def take(self, wanted: list[Bucket]) -> Verdict:
        if not wanted:
            return Verdict(True)
        args: list[float] = []
        for bucket in wanted:
            args += [bucket.capacity, bucket.rate, bucket.cost]
        try:
            wait = float(await self.script(keys=[b.key for b in wanted], args=args))
        except (RedisError, OSError) as exc:
            log.warning("rate limits not applied, Redis unavailable: %s", exc)
            raise LimitsUnavailable from exc
        return Verdict(wait <= 0, wait)


class LimitsUnavailable(Exception):
    """Redis did not answer: the request passes unlimited (see the module's docstring)."""
