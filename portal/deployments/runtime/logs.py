"""Instance logs for people: read through the instance's launcher, formatted line by line.

An instance's log mixes plain lines (Triton, uvicorn, ``INSTANCE READY``) with the JSON lines
of its structured start-up log (:mod:`serving.instance.log`: ``ts``, ``component``, ``event``,
``step``, ``status``, ``duration_s``, ``error``). Nobody should read raw JSON on a page or in a
status, so a JSON line is shown as ``time level logger: message`` and plain lines are kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from portal.deployments.runtime.launchers.base import LOG_CHUNK_LINES, LOG_DEFAULT_TAIL, LogChunk

#: The lines a failed instance's summary shows.
FAILURE_LINES = 20
#: Fields of a structured line that the formatted message already says in words.
_SHOWN = {"ts", "time", "timestamp", "asctime", "level", "levelname", "logger", "name"}
_SHOWN |= {"component", "event", "message", "msg", "step", "status", "duration_s", "error"}


def format_line(line: str, *, with_time: bool = True) -> str:
    """``time level logger: message`` for a JSON log line; any other line as it is."""
    text = line.rstrip("\n")
    if not text.lstrip().startswith("{"):
        return text
    try:
        record = json.loads(text)
    except ValueError:
        return text
    if not isinstance(record, dict):
        return text
    level = str(record.get("level") or record.get("levelname") or _level(record)).upper()
    logger = str(record.get("logger") or record.get("name") or record.get("component") or "log")
    head = f"{level} {logger}: {_message(record)}"
    stamp = _time(record) if with_time else ""
    return f"{stamp} {head}" if stamp else head


def _level(record: dict[str, Any]) -> str:
    if record.get("status") == "failed" or record.get("event") == "start_aborted":
        return "error"
    return "info"


def _time(record: dict[str, Any]) -> str:
    value = record.get("ts", record.get("time", record.get("timestamp", record.get("asctime"))))
    if isinstance(value, int | float):
        moment = datetime.fromtimestamp(value, tz=UTC)
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return str(value) if value else ""


def _message(record: dict[str, Any]) -> str:
    message = record.get("message") or record.get("msg")
    event = record.get("event")
    if message is None and event == "step":
        message = f"{record.get('step', '?')} {record.get('status', '')}".strip()
        if "duration_s" in record:
            message += f" in {record['duration_s']} s"
    elif message is None and event == "start_aborted":
        message = f"start-up stopped at {record.get('step', '?')}"
    elif message is None:
        message = str(event or "")
    if record.get("error"):
        message += f": {record['error']}"
    extra = " ".join(f"{key}={_value(value)}" for key, value in record.items() if key not in _SHOWN)
    return f"{message} ({extra})" if extra else str(message)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


# --- reading an instance's log -----------------------------------------------------------------


@dataclass(frozen=True)
class InstanceLogSource:
    """Where one instance's log is read from: its launcher and version set, resolved once. A
    read through it touches no database, so a follower can poll it for as long as it likes."""

    launcher: Any
    version_set: Any
    name: str

    def read(self, *, since: str | None, tail: int = LOG_DEFAULT_TAIL) -> LogChunk:
        chunk = self.launcher.read_log(
            self.version_set, self.name, since=since, tail=min(tail, LOG_CHUNK_LINES)
        )
        return LogChunk([format_line(line) for line in chunk.lines], chunk.next, chunk.ended)


def instance_log_source(instance: Any) -> InstanceLogSource | None:
    """The source of ``instance``'s log; None for an instance started by another kind of
    launcher than the one configured now (its log cannot be read here)."""
    # Imported here: the launchers import this module's formatter.
    from portal.deployments.runtime.launchers import get_launcher, version_set

    launcher = get_launcher(instance.deployment.region)
    if instance.launcher != launcher.kind:
        return None
    return InstanceLogSource(
        launcher, version_set(instance.deployment, instance.version), instance.name
    )


def read_instance_log(
    instance: Any, *, since: str | None = None, tail: int = LOG_DEFAULT_TAIL
) -> LogChunk:
    """A bounded chunk of ``instance``'s log, lines formatted. An instance whose log cannot be
    read here (see :func:`instance_log_source`) has no lines and has ended. Raises
    :class:`~portal.deployments.runtime.launchers.base.LogCursorError` for a bad ``since``."""
    source = instance_log_source(instance)
    if source is None:
        return LogChunk([], since or "", ended=True)
    return source.read(since=since, tail=tail)


#: How long one follow call waits for new lines before answering with none.
FOLLOW_WAIT_SECONDS = 20.0
#: How often a waiting follow call reads the log again.
FOLLOW_POLL_SECONDS = 0.5


def follow_instance_log(
    instance: Any,
    *,
    since: str | None,
    tail: int = LOG_DEFAULT_TAIL,
    wait_seconds: float = FOLLOW_WAIT_SECONDS,
    poll_seconds: float = FOLLOW_POLL_SECONDS,
) -> LogChunk:
    """A bounded long poll that holds its thread: the next lines after ``since`` as soon as
    there are some, else after ``wait_seconds`` an empty chunk. Only for a server that runs
    each request on a thread of its own (Django's development server, the test client); the
    portal's ASGI server waits with :func:`follow_log_async` instead. The wait holds no
    database connection."""
    source = instance_log_source(instance)
    if source is None:
        return LogChunk([], since or "", ended=True)
    deadline = time.monotonic() + wait_seconds
    while True:
        chunk = source.read(since=since, tail=tail)
        if chunk.lines or chunk.ended or time.monotonic() >= deadline:
            return chunk
        if not connection.in_atomic_block:
            connection.close()
        since = chunk.next
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))


async def follow_log_async(
    source: InstanceLogSource,
    *,
    since: str,
    tail: int = LOG_DEFAULT_TAIL,
    wait_seconds: float = FOLLOW_WAIT_SECONDS,
    poll_seconds: float = FOLLOW_POLL_SECONDS,
) -> LogChunk:
    """:func:`follow_instance_log` on an event loop: the wait is a sleep that holds no thread
    and no connection, and each read (a file, or the cluster's API) runs briefly on the loop's
    thread pool. Cancelled (the caller went away), it stops at once."""
    deadline = time.monotonic() + wait_seconds
    while True:
        chunk = await asyncio.to_thread(source.read, since=since, tail=tail)
        if chunk.lines or chunk.ended or time.monotonic() >= deadline:
            return chunk
        since = chunk.next
        await asyncio.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))


@dataclass(frozen=True)
class FailureSummary:
    """What a failed instance's page shows once: why it ended and the end of its log."""

    reason: str
    lines: list[str]


def failure_summary(instance: Any, lines: int = FAILURE_LINES) -> FailureSummary | None:
    """For a failed instance, its exit reason and its last ``lines`` log lines, formatted;
    None for any other. The log may be gone (a launcher keeps a crashed one only a while):
    then the reason alone."""
    if instance.state != "failed":
        return None
    try:
        chunk = read_instance_log(instance, tail=lines)
    except Exception:  # the reason is worth showing even when the log cannot be read
        return FailureSummary(instance.health_message, [])
    return FailureSummary(instance.health_message, chunk.lines)
