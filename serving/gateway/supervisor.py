"""Several gateway processes on one port, and another started when one dies.

Each process binds the port with SO_REUSEPORT, so the kernel spreads new connections over the
ones listening; when one dies, its listening socket closes with it and new connections go to
the others. What is lost is what that process had in flight (and connections the kernel had
queued on its socket), never the port. The supervisor itself accepts nothing and holds no
table: it only forks the processes, says ready once all of them listen, starts a replacement
(backing off when one keeps dying at once), and on SIGTERM passes the signal on and waits for
them to drain.

Metrics stay whole across processes: the supervisor points prometheus_client's multiprocess
mode at a fresh directory before anything imports it (which is why :mod:`serving.gateway`'s
entry point imports the proxy only in the worker), each process writes its values there, and
``/metrics``, whichever process answers, sums them.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

log = logging.getLogger("serving.gateway.supervisor")

#: A process that dies sooner than this after its start counts as failing to start: the next
#: one waits, doubling up to BACKOFF_MAX_SECONDS.
QUICK_DEATH_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 30.0
POLL_SECONDS = 0.1
#: prometheus_client reads it when its first metric is made.
MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

ServeOne = Callable[[argparse.Namespace, Callable[[], None]], int]


def supervise(args: argparse.Namespace, serve_one: ServeOne) -> int:
    metrics_dir = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[MULTIPROCESS_DIR_VARIABLE] = metrics_dir
    try:
        return _supervise(args, serve_one)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise(args: argparse.Namespace, serve_one: ServeOne) -> int:
    from prometheus_client import multiprocess  # only now: it reads the variable set above

    context = multiprocessing.get_context("fork")  # nothing runs yet that forking could break
    ready = context.SimpleQueue()
    stopping = False

    def child(slot: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker installs its own
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        raise SystemExit(serve_one(args, lambda: ready.put(slot)))

    def start(slot: int) -> BaseProcess:
        process = context.Process(target=child, args=(slot,), name=f"gateway-{slot}")
        process.start()
        return process

    def on_signal(_signum: int, _frame: Any) -> None:
        """Pass SIGTERM (or Ctrl-C) on: each process stops accepting and drains."""
        nonlocal stopping
        stopping = True
        for process in workers.values():
            if process.is_alive():
                process.terminate()

    workers = {slot: start(slot) for slot in range(args.workers)}
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    waiting = set(workers)
    failed_start = False
    while waiting and not stopping:
        if not ready.empty():
            waiting.discard(ready.get())
        elif any(not workers[slot].is_alive() for slot in waiting):
            log.error("a gateway process died before it listened")
            failed_start = True
            on_signal(signal.SIGTERM, None)
            break
        else:
            time.sleep(POLL_SECONDS)
    if not stopping:
        print(f"GATEWAY READY http://{args.host}:{args.port}", flush=True)
    started_at = {slot: time.monotonic() for slot in workers}
    quick_deaths = dict.fromkeys(workers, 0)
    while not stopping:
        for slot, process in list(workers.items()):
            if process.is_alive() or stopping:
                continue
            multiprocess.mark_process_dead(process.pid)  # its gauges leave the live sums
            if process.exitcode == 0:
                # A worker exits 0 only after a SIGTERM: one sent to the whole process group
                # (a service manager stopping us) that reached it before this process.
                on_signal(signal.SIGTERM, None)
                break
            lived = time.monotonic() - started_at[slot]
            quick_deaths[slot] = quick_deaths[slot] + 1 if lived < QUICK_DEATH_SECONDS else 0
            delay = min(BACKOFF_MAX_SECONDS, 2.0 ** quick_deaths[slot] - 1)
            log.warning(
                "gateway process %s (pid %s) exited with %s after %.1f s; starting another%s",
                slot,
                process.pid,
                process.exitcode,
                lived,
                f" in {delay:.0f} s" if delay else "",
            )
            _sleep_unless(lambda: stopping, delay)
            if not stopping:
                workers[slot] = start(slot)
                started_at[slot] = time.monotonic()
        while not ready.empty():
            ready.get()  # replacements say they listen; nothing waits on it any more
        time.sleep(POLL_SECONDS)
    deadline = time.monotonic() + args.drain_timeout + 5
    for process in workers.values():
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
    return 1 if failed_start else 0


def _sleep_unless(stop: Callable[[], bool], seconds: float) -> None:
    end = time.monotonic() + seconds
    while not stop() and time.monotonic() < end:
        time.sleep(POLL_SECONDS)
