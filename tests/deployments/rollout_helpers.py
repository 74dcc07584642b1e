"""What the rollout tests run: the local gateway, a real worker, callers under load, and ways to
read what the controller did. Everything is a real process on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from tritonclient.http import InferenceServerClientPlugin

from portal.deployments.models import Deployment, Instance
from portal.deployments.runtime.launchers.local import process_started
from tests.conftest import die_with_pytest
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2, explain=None):
    """Poll until ``predicate`` returns something true. On a timeout the error carries what
    ``explain()`` returns, so a failure seen only once in CI can still be diagnosed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout} s waiting for {what}"
            if explain is not None:
                message += "\n" + explain()
            raise AssertionError(message)
        time.sleep(interval)


#: Each gateway's metrics URL by its URL: /metrics is served on a port of its own.
_METRICS_URLS: dict[str, str] = {}


def metrics_url(gateway_url: str) -> str:
    """Where the gateway at ``gateway_url`` (started by :func:`start_gateway`) serves /metrics."""
    return _METRICS_URLS[gateway_url]


def start_gateway(
    redis_url: str, *options: str, env: dict[str, str] | None = None, port: int | None = None
) -> tuple[subprocess.Popen, str]:
    port = port or free_port()
    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.gateway",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--redis-url",
            redis_url,
            *options,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_pytest,
        env=None if env is None else os.environ | env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("GATEWAY READY"), line
    url = f"http://127.0.0.1:{port}"
    _METRICS_URLS[url] = f"http://127.0.0.1:{metrics_port}"
    return proc, url


class BearerKey(InferenceServerClientPlugin):
    """Sends a caller key with every request of a tritonclient client
    (``client.register_plugin(BearerKey(key))``)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, request) -> None:
        request.headers["Authorization"] = f"Bearer {self.key}"


def instance_processes(run_root: Path) -> dict[str, psutil.Process]:
    """Every instance process still alive under the launcher's run directory, by name."""
    alive = {}
    for record_path in run_root.glob("*/*/instance.json"):
        record = json.loads(record_path.read_text())
        with contextlib.suppress(psutil.Error, KeyError, TypeError):
            process = psutil.Process(record["pid"])
            if (
                abs(process_started(process) - record["pid_started_since_boot"]) < 0.01
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                alive[record["name"]] = process
    return alive


def kill_instance_processes(run_root: Path) -> None:
    for process in instance_processes(run_root).values():
        with contextlib.suppress(psutil.Error):
            for child in process.children(recursive=True):
                child.kill()
            process.kill()


@dataclass
class Result:
    started: float
    status: int
    served_by: str
    error: str = ""


@dataclass
class Load:
    """A bounded loop of concurrent completion requests through the gateway."""

    url: str
    model: str
    clients: int = 3
    #: The caller key sent as ``Authorization: Bearer``.
    key: str = ""
    #: Tokens per completion (with ``ignore_eos``, each request takes that many decode steps).
    max_tokens: int = 3
    #: Each client's pause between two requests. Paced by default: three callers at about 20
    #: requests a second each keep every instance busy through a rollout, while a busy loop would
    #: take the cores the instances start on (and the other test worker's). A test that needs
    #: saturated instances (autoscaling) passes 0.
    pause_seconds: float = 0.05
    results: list[Result] = field(default_factory=list)
    #: The instances that answered (``X-Served-By``).
    instances: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _paused: threading.Event = field(default_factory=threading.Event)
    _in_flight: list[int] = field(default_factory=lambda: [0])
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for _ in range(self.clients):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self) -> None:
        body = {"model": self.model, "prompt": "Hello", "max_tokens": self.max_tokens}
        if self.max_tokens != 3:
            body["ignore_eos"] = True
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        with httpx.Client(timeout=60, headers=headers) as client:
            while not self._stop.is_set():
                with self._lock:  # checked and counted at once: quiet() sees every start
                    paused = self._paused.is_set()
                    if not paused:
                        self._in_flight[0] += 1
                if paused:
                    time.sleep(0.02)
                    continue
                started = time.time()
                try:
                    answer = client.post(self.url + "/completions", json=body)
                    result = Result(
                        started,
                        answer.status_code,
                        answer.headers.get("x-served-version", ""),
                        "" if answer.status_code == 200 else answer.text[:300],
                    )
                    self.instances.add(answer.headers.get("x-served-by", ""))
                except httpx.HTTPError as exc:
                    result = Result(started, 0, "", repr(exc))
                finally:
                    with self._lock:
                        self._in_flight[0] -= 1
                self.results.append(result)
                if self.pause_seconds:
                    self._stop.wait(self.pause_seconds)

    @contextlib.contextmanager
    def quiet(self):
        """No request in flight inside the block (callers pause; none is lost)."""
        with self._lock:
            self._paused.set()
        wait_for(lambda: self._in_flight[0] == 0, 60, "in-flight requests to finish", 0.01)
        try:
            yield
        finally:
            self._paused.clear()

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status != 200]

    def mix(self, since: float = 0.0, until: float = float("inf")) -> Counter[str]:
        return Counter(r.served_by for r in self.results if since <= r.started < until)


def kill_between_requests(load: Load, run_root: Path, instance: Instance) -> None:
    """kill -9 an instance and its engine while no request is in flight (one in flight on a
    crashed instance is lost, and no proxy may replay it), and wait until they are gone: a
    connection the kernel queued while the process was being torn down would be reset, and
    that request would have been in flight too."""
    with load.quiet():
        process = instance_processes(run_root)[instance.name]
        dying = [process, *process.children(recursive=True)]
        for each in dying:
            each.kill()
        psutil.wait_procs(dying, timeout=10)


def timeline(deployment: Deployment) -> list[str]:
    return [e.message for e in deployment.events.order_by("created_at", "id")]


def explain(deployment: Deployment, run_root: Path) -> str:
    """The deployment as the controller left it: states, its instances, its last events and the
    end of each instance's log."""
    deployment.refresh_from_db()
    lines = [
        f"deployment {deployment.pk}: observed={deployment.observed_state} "
        f"desired={deployment.desired_state} stage={deployment.current_stage} "
        f"step={deployment.step} last_reconciled_at={deployment.last_reconciled_at}",
        f"status: {deployment.status_message}",
    ]
    for instance in deployment.instances.order_by("id"):
        lines.append(
            f"instance {instance.name} v{instance.version.number} {instance.state}: "
            f"{instance.health_message} (created {instance.created_at:%H:%M:%S})"
        )
    events = list(deployment.events.order_by("-created_at", "-id")[:10])
    lines += [f"event {e.created_at:%H:%M:%S} {e.message}" for e in reversed(events)]
    for log in sorted(run_root.glob("*/*/instance.log")):
        tail = log.read_text(errors="replace").splitlines()[-8:]
        lines += [f"log {log.parent.name}:", *(f"  {line}" for line in tail)]
    return "\n".join(lines)


def live_instances(deployment: Deployment) -> list[Instance]:
    return list(deployment.instances.exclude(state__in=["stopped", "failed"]))


def in_bake(deployment: Deployment, stage: int) -> bool:
    """The stage bakes, and its baseline holds every new instance's counts: what is sent from now
    on is judged by the bake (an instance unread when the bake began has no baseline yet)."""
    deployment.refresh_from_db()
    return (
        deployment.observed_state == "progressing"
        and deployment.current_stage == stage
        and deployment.step.phase == "bake"
        and not deployment.step.unread
    )
