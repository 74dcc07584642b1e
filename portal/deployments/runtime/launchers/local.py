"""Instances as serving processes on this machine, behind the local gateway (the default).

Each instance owns a run directory, ``INSTANCE_RUN_ROOT/<set key>/<name>/``, holding
``instance.json`` (the process id and its start time, the ports it announced, when it was told
to stop), its log and its work directory. That directory, not the worker that started the
process, is the truth: the process runs in its own session, so a Celery worker killed at any
point leaves it running and the next worker finds it by reading the directory.

Ports: the instance binds port 0 and announces the ports it got in its ``INSTANCE READY`` line,
which the launcher reads back from the log; no port is ever picked and then raced for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from django.conf import settings

from portal.core.redis_clients import redis_client
from portal.deployments.runtime.launchers.base import (
    LOG_CHUNK_BYTES,
    LOG_CHUNK_LINES,
    LOG_DEFAULT_TAIL,
    Health,
    Launcher,
    LogChunk,
    LogCursorError,
    ObservedInstance,
    RegionConfig,
    Route,
    VersionSet,
)
from portal.deployments.runtime.launchers.gateway_routes import GatewayRoutes
from portal.deployments.runtime.logs import format_line

RECORD = "instance.json"
LOG = "instance.log"
READY_LINE = re.compile(
    r"^INSTANCE READY openai=(?P<openai>\d+) http=(?P<http>\d+) grpc=(?P<grpc>\d+) "
    r"metrics=(?P<metrics>\d+)$",
    re.MULTILINE,
)
#: Logs of crashed instances kept per version set after :meth:`LocalLauncher.forget` (the rest
#: of their run directory goes), so a failed instance's page can still show how it ended.
KEEP_CRASHED_LOGS = 10
#: A draining instance still alive this long after its drain deadline is killed.
KILL_GRACE_SECONDS = 10.0
HEALTH_TIMEOUT_SECONDS = 2.0


class LocalLauncher(Launcher):
    kind = "local"

    def __init__(self, region: RegionConfig | None = None) -> None:
        self.run_root: Path = region.run_root if region else settings.INSTANCE_RUN_ROOT
        prefix = region.gateway_prefix if region else settings.GATEWAY_REDIS_PREFIX
        self.gateway = GatewayRoutes(redis_client(), prefix)

    # --- instances ----------------------------------------------------------------------------

    def start(self, version_set: VersionSet, count: int) -> list[str]:
        return [self._start_one(version_set) for _ in range(count)]

    def _start_one(self, version_set: VersionSet) -> str:
        name = f"{version_set.key}-{secrets.token_hex(3)}"
        directory = self._set_dir(version_set) / name
        (directory / "work").mkdir(parents=True)
        # The record exists before the process does: a worker killed in between leaves a
        # record without a pid, which observe() reports as a start that never happened.
        _write_record(directory, {"name": name, "created_at": time.time(), "pid": None})
        command = [
            sys.executable,
            "-m",
            "serving.instance",
            "--package",
            str(version_set.package_path),
            "--workdir",
            str(directory / "work"),
            "--engine",
            version_set.shape.serving_engine,
            "--host",
            "127.0.0.1",
            *("--openai-port", "0", "--http-port", "0", "--grpc-port", "0"),
            *("--metrics-port", "0"),
            "--drain-timeout",
            str(settings.INSTANCE_DRAIN_SECONDS),
        ]
        with open(directory / LOG, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=directory,
                start_new_session=True,  # outlives the worker that started it
                env=_instance_environment(),
            )
        _update_record(
            directory,
            pid=process.pid,
            pid_started_since_boot=process_started(psutil.Process(process.pid)),
        )
        return name

    def stop(self, version_set: VersionSet, names: list[str], drain_seconds: float) -> None:
        for name in names:
            directory = self._set_dir(version_set) / name
            record = _read_record(directory)
            if record is None or record.get("stop_requested_at"):
                continue
            _update_record(
                directory, stop_requested_at=time.time(), drain_deadline=time.time() + drain_seconds
            )
            process = _process(record)
            if process is not None:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGTERM)

    def observe(self, version_set: VersionSet) -> list[ObservedInstance]:
        directory = self._set_dir(version_set)
        if not directory.is_dir():
            return []
        found = []
        for path in sorted(directory.iterdir()):
            record = _read_record(path)
            if record is not None:
                found.append(self._observe_one(path, record))
        return found

    def _observe_one(self, directory: Path, record: dict[str, Any]) -> ObservedInstance:
        name = record["name"]
        process = _process(record)
        endpoints = record.get("endpoints") or {}
        stopping = bool(record.get("stop_requested_at"))
        if process is None:
            if stopping:
                return ObservedInstance(name, Health.EXITED, endpoints, "stopped")
            if record.get("pid") is None and time.time() - record["created_at"] < 30:
                return ObservedInstance(name, Health.STARTING, endpoints, "launching")
            return ObservedInstance(name, Health.CRASHED, endpoints, _crash_reason(directory))
        if stopping:
            if time.time() > record["drain_deadline"] + KILL_GRACE_SECONDS:
                _kill_tree(process)
            return ObservedInstance(name, Health.DRAINING, endpoints, "finishing requests")
        if not endpoints:
            endpoints = _announced_endpoints(directory)
            if not endpoints:
                return ObservedInstance(name, Health.STARTING, {}, "loading the model")
            _update_record(directory, endpoints=endpoints)
        if _ready(endpoints):
            if not record.get("ready_at"):
                _update_record(directory, ready_at=time.time())
            return ObservedInstance(name, Health.READY, endpoints)
        if record.get("ready_at"):
            return ObservedInstance(name, Health.UNHEALTHY, endpoints, "health check failing")
        return ObservedInstance(name, Health.STARTING, endpoints, "not ready yet")

    def forget(self, version_set: VersionSet, names: list[str]) -> None:
        for name in names:
            directory = self._set_dir(version_set) / name
            record = _read_record(directory)
            if record is not None and _process(record) is not None:
                continue  # still running: never drop the only handle on a live process
            if record is not None and not record.get("stop_requested_at"):
                # A crash: keep only its log, for the failed instance's page.
                for path in directory.iterdir() if directory.is_dir() else []:
                    if path.name == LOG:
                        continue
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                if (directory / LOG).exists():
                    continue
            shutil.rmtree(directory, ignore_errors=True)
        self._prune_crashed_logs(version_set)
        with contextlib.suppress(OSError):
            self._set_dir(version_set).rmdir()  # only if now empty

    def stop_all(self, drain_seconds: float) -> list[str]:
        """Stop every instance under the run root (``./dev run`` on its way out). The
        deployments still want them: the controller starts them again next time."""
        stopped = []
        for directory in sorted(self.run_root.glob("*/*/")):
            record = _read_record(directory)
            if record is None or _process(record) is None:
                continue
            _update_record(
                directory, stop_requested_at=time.time(), drain_deadline=time.time() + drain_seconds
            )
            with contextlib.suppress(psutil.Error):
                psutil.Process(record["pid"]).send_signal(signal.SIGTERM)
            stopped.append(record["name"])
        return stopped

    def _prune_crashed_logs(self, version_set: VersionSet) -> None:
        """Only the newest :data:`KEEP_CRASHED_LOGS` kept logs of a set stay."""
        directory = self._set_dir(version_set)
        if not directory.is_dir():
            return
        kept = [p for p in directory.iterdir() if p.is_dir() and not (p / RECORD).exists()]
        kept.sort(key=lambda p: _mtime(p / LOG), reverse=True)
        for path in kept[KEEP_CRASHED_LOGS:]:
            shutil.rmtree(path, ignore_errors=True)

    def _set_dir(self, version_set: VersionSet) -> Path:
        return self.run_root / version_set.key

    # --- logs ---------------------------------------------------------------------------------

    def read_log(
        self,
        version_set: VersionSet,
        name: str,
        *,
        since: str | None = None,
        tail: int = LOG_DEFAULT_TAIL,
    ) -> LogChunk:
        """The cursor is a byte offset into ``instance.log``; the file is read from there (or
        from its last :data:`LOG_CHUNK_BYTES` for a first read), never whole."""
        offset = _offset(since)
        directory = self._set_dir(version_set) / name
        record = _read_record(directory)
        gone = record is None or (record.get("pid") is not None and _process(record) is None)
        try:
            handle = open(directory / LOG, "rb")  # noqa: SIM115 (closed below)
        except OSError:
            return LogChunk([], str(offset or 0), ended=gone)
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if offset is None or offset > size:  # a first read, or a log started over
                start = max(0, size - LOG_CHUNK_BYTES) if offset is None else 0
            else:
                start = offset
            handle.seek(start)
            data = handle.read(LOG_CHUNK_BYTES)
        at_end = gone and start + len(data) >= size
        lines, consumed = _complete_lines(data, at_end=at_end, cap=offset is not None)
        if offset is None:
            if start > 0 and lines:
                lines = lines[1:]  # the first one begins before the window
            lines = lines[-tail:] if tail > 0 else []
        next_offset = start + consumed
        return LogChunk(lines, str(next_offset), ended=gone and next_offset >= size)

    # --- traffic ------------------------------------------------------------------------------

    def set_traffic(self, routes: list[Route]) -> int:
        return self.gateway.publish(routes)

    def traffic_applied(self, generation: int) -> bool:
        return self.gateway.applied(generation)

    def last_requests(self) -> dict[str, float]:
        return self.gateway.last_requests()

    def gateway_observations(self, route: str, since: float, until: float) -> list[dict[str, Any]]:
        return self.gateway.observations(route, since, until)


# --- the run directory ------------------------------------------------------------------------


def _read_record(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return None


def _write_record(directory: Path, record: dict[str, Any]) -> None:
    tmp = directory / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, directory / RECORD)


def _update_record(directory: Path, **changes: Any) -> None:
    record = _read_record(directory) or {}
    record.update(changes)
    _write_record(directory, record)


def _instance_environment() -> dict[str, str]:
    """This process's environment, less a ``PROMETHEUS_MULTIPROC_DIR`` set for the portal's own
    web server: each instance keeps its metrics files in its own work directory (an instance
    empties that directory when it starts, so a shared one would lose the others' counts)."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return {**env, "PYTHONUNBUFFERED": "1"}


def process_started(process: psutil.Process) -> float:
    """When ``process`` started, in seconds since boot: what tells it from a later process given
    the same pid. Not ``create_time()`` as such: that adds the boot time, which Linux derives
    from the wall clock (``btime``), so it moves by whole seconds whenever the clock is set (NTP
    stepping a busy VM's clock) and every recorded instance would at once look like another
    process, "exited without being asked to" while it still served (seen under the CPU hog)."""
    return process.create_time() - psutil.boot_time()


def _same_process(process: psutil.Process, record: dict[str, Any]) -> bool:
    started = record.get("pid_started_since_boot")
    if started is not None:
        return abs(process_started(process) - started) < 0.01
    # A record written before the start was kept relative to boot: its wall-clock start time,
    # allowing for the clock having been set since.
    return abs(process.create_time() - record.get("pid_started", 0.0)) < 2.0


def _process(record: dict[str, Any]) -> psutil.Process | None:
    """The recorded process if it is still alive; a reused pid (another start time) is not it."""
    pid = record.get("pid")
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        if not _same_process(process, record):
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # our own child: reap it
            return None
        return process
    except psutil.Error:
        return None


def _kill_tree(process: psutil.Process) -> None:
    with contextlib.suppress(psutil.Error):
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        process.kill()


def _announced_endpoints(directory: Path) -> dict[str, str]:
    match = READY_LINE.search(_tail(directory / LOG, 200))
    if match is None:
        return {}
    base = "http://127.0.0.1:"
    return {
        "openai": base + match["openai"],
        "kserve_http": base + match["http"],
        "kserve_grpc": "127.0.0.1:" + match["grpc"],
        # The unified /metrics (Triton- and vLLM-named) is served by the front end.
        "metrics": base + match["openai"] + "/metrics",
    }


def _ready(endpoints: dict[str, str]) -> bool:
    try:
        answer = httpx.get(
            endpoints["kserve_http"] + "/v2/health/ready", timeout=HEALTH_TIMEOUT_SECONDS
        )
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def _crash_reason(directory: Path) -> str:
    """One short sentence: the failed start-up step if the log names one, else its last line
    (formatted, cut to 200 characters). The whole end of the log is the logs page's to show;
    this text goes into statuses and the timeline, once."""
    lines = [line for line in _tail(directory / LOG, 50).splitlines() if line.strip()]
    failed = [line for line in lines if '"status": "failed"' in line]
    why = format_line((failed or lines or [""])[-1], with_time=False).strip()
    if len(why) > 200:
        why = why[:199] + "…"
    return "the process exited without being asked to" + (f"; last: {why}" if why else "")


def _offset(since: str | None) -> int | None:
    if since is None or since == "":
        return None
    if not since.isdigit():
        raise LogCursorError(f"since={since!r} is not a cursor of this log (a byte offset).")
    return int(since)


def _complete_lines(data: bytes, *, at_end: bool, cap: bool) -> tuple[list[str], int]:
    """The whole lines in ``data`` and how many bytes they take. A line still being written is
    held back (the next read returns it whole), unless the log has ended or one line fills the
    whole chunk (then it is returned cut, so a reader never stalls on it). With ``cap``, only the
    first :data:`LOG_CHUNK_LINES` (a tail read keeps the last ones itself)."""
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) >= LOG_CHUNK_BYTES:
        cut = len(data)
    if at_end:
        cut = len(data)
    raw = data[:cut].split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    if cap and len(raw) > LOG_CHUNK_LINES:
        raw = raw[:LOG_CHUNK_LINES]
        cut = sum(len(line) + 1 for line in raw)
    return [line.decode("utf-8", "replace").rstrip("\r") for line in raw], cut


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
