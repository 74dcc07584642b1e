"""Several gateway processes on one port, and another started when one dies.

Each process binds the port with SO_REUSEPORT, so the kernel spreads new connections over the
ones listening; when one dies, its listening socket closes with it and new connections go to
the others. What is lost is what that process had in flight (and connections the kernel had
queued on its socket), never the port. The supervisor itself accepts nothing and holds no
table: it only forks the processes, says ready once all of them listen, starts a replacement
(backing off when one keeps dying at once), and on SIGTERM passes the signal on and waits for
them to drain.

Its processes die with it: each asks the kernel for SIGTERM when the supervisor dies (so a
supervisor killed with SIGKILL leaves no process serving untracked; each drains what it has in
flight and exits). And a supervisor starts none while anything else listens on its port (an
orphan of an older gateway, another program): processes sharing a port through SO_REUSEPORT
would split its connections between them.

Metrics stay whole across processes: the supervisor points prometheus_client's multiprocess
mode at a fresh directory before anything imports it (which is why :mod:`serving.gateway`'s
entry point imports the proxy only in the worker), each process writes its values there, and
``/metrics``, whichever process answers, sums them.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
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
PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: prometheus_client reads it when its first metric is made.
MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

ServeOne = Callable[[argparse.Namespace, Callable[[], None]], int]


def supervise(args: argparse.Namespace, serve_one: ServeOne) -> int:
    ports = [(args.host, args.port)]
    if args.metrics_port:
        ports.append((args.metrics_host or args.host, args.metrics_port))
    for host, port in ports:
        if not port_free(host, port, args.port_wait):
            log.error(
                "%s:%s is in use (processes of another gateway still listening?): not starting",
                host,
                port,
            )
            return 1
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

    supervisor = os.getpid()

    def child(slot: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker installs its own
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        die_with_parent(supervisor)
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
                if stopping:  # a SIGTERM handled while it forked passed it by
                    workers[slot].terminate()
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


def die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when ``parent`` dies (Linux); exit now if it
    died already, before the request was made."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %s", ctypes.get_errno())
    if os.getppid() != parent:
        raise SystemExit(0)


def port_free(host: str, port: int, wait_seconds: float) -> bool:
    """Whether nothing listens on ``host:port``, waiting up to ``wait_seconds`` for it to be.
    A socket without SO_REUSEPORT cannot bind beside a listening one, SO_REUSEPORT or not
    (SO_REUSEADDR lets it bind over connections still closing)."""
    deadline = time.monotonic() + wait_seconds
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
            else:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
