"""Gunicorn settings for the portal's web server (the Procfile and the Docker image load them
with ``--config python:portal.gunicorn_conf``; the address stays on the command line).

Several worker processes answer requests, but Prometheus scrapes one of them at a time. So the
portal's request metrics use prometheus-client's multiprocess mode: each worker writes its
counts to files in ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics``, whichever worker answers it,
adds up the files of all of them, those that have exited included. The variable is set here,
in the master before it forks, because prometheus-client picks its storage when first imported.
This module must not import Django: gunicorn loads it before the settings exist.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
#: Threads per worker (gunicorn's gthread worker): a page following an instance's log holds one
#: request open for up to 20 s (a bounded long poll, see portal.deployments.logs), which must
#: not take a whole worker process from everyone else.
threads = int(os.environ.get("WEB_THREADS", "8"))
#: Seconds an idle keep-alive connection stays open. Gunicorn's default, 2, is below what clients
#: and load balancers keep an idle connection for (httpx 5 s, AWS ALB 60 s): a client sending on
#: a connection the server is closing that moment gets "Server disconnected without sending a
#: response". Above the balancer's idle timeout, the balancer closes first. Idle connections wait
#: in the gthread worker's poller and hold no thread.
keepalive = int(os.environ.get("WEB_KEEPALIVE_SECONDS", "75"))
accesslog = "-"
graceful_timeout = 20

_var_dir = Path(os.environ.get("PORTAL_VAR_DIR", Path(__file__).resolve().parent.parent / "var"))
metrics_dir = Path(os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(_var_dir / "web-metrics")))


def on_starting(server: object) -> None:
    """Counts left by an earlier server are not this one's: start from an empty directory."""
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True, exist_ok=True)


def child_exit(server: object, worker: object) -> None:
    """A worker exited (restarted, killed): its counts stay and its live gauges go."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]
