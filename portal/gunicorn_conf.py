"""Gunicorn settings for the portal's web server (the Procfile and the Docker image load them
with ``--config python:portal.gunicorn_conf``; the address stays on the command line): the
ASGI application :mod:`portal.asgi` on uvicorn's worker class.

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
#: Each worker is an event loop serving the ASGI app (portal/asgi.py): Django runs a synchronous
#: view on a thread of its own per request, and a waiting request (a log follow, see
#: portal/api/log_follow.py) holds no thread at all, so no number of followers can take the
#: threads that /livez and the API need.
worker_class = "portal.web_worker.PortalWorker"
#: Seconds an idle keep-alive connection stays open. Gunicorn's default, 2, is below what clients
#: and load balancers keep an idle connection for (httpx 5 s, AWS ALB 60 s): a client sending on
#: a connection the server is closing that moment gets "Server disconnected without sending a
#: response". Above the balancer's idle timeout, the balancer closes first. Idle connections
#: cost the event loop nothing.
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
