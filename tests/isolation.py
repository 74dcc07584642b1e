"""What each pytest-xdist worker gets of its own, set before Django reads its settings.

Called by ``tests.settings`` (the test run's settings module, ``--ds``) before
``portal.settings`` reads the environment. Each xdist worker is its own process with
``PYTEST_XDIST_WORKER`` set (``gw0``, ``gw1``, ...); a run without xdist is worker 0.

Per worker:
- PostgreSQL: pytest-django's own suffix (``test_portal_gw0``), nothing to do here;
- Redis: its own pair of databases (the tests' and a spare one for tests that run a whole
  platform), so one worker's ``FLUSHDB`` never wipes another's routing tables or tasks;
- Celery: its own queue (tests/conftest.py, per process), so a worker process started by one
  xdist worker never takes another's tasks;
- the gateways' keys (routing tables, caller keys, wakes) live in that Redis database, so the
  default prefix stays (tests read ``gateway:routes``);
- the var directory (``PORTAL_VAR_DIR``: anything a test forgets to point at its ``tmp_path``)
  and pytest's ``tmp_path`` (per worker already);
- ports: every server binds a free port the kernel handed out (tests/ports.py).
"""

from __future__ import annotations

import os
import tempfile
from urllib.parse import urlsplit, urlunsplit

#: Databases 0 (./dev run) and 1 are left alone; each worker takes two from the top down.
_FIRST_DB = 15


def worker_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0")


def worker_index() -> int:
    return int(worker_name().removeprefix("gw") or 0)


def _redis_db_url(base: str, db: int) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def _databases(index: int) -> tuple[int, int]:
    tests_db = _FIRST_DB - 2 * index
    if tests_db - 1 < 2:
        raise RuntimeError(
            f"xdist worker {index}: Redis has 16 databases, enough for 7 workers (-n 7 at most)"
        )
    return tests_db, tests_db - 1


def spare_redis_url() -> str:
    """A Redis database of this worker's that no fixture flushes: for a test that runs a whole
    platform (``./dev demo``) beside the worker's own."""
    return os.environ["TEST_SPARE_REDIS_URL"]


def isolate() -> None:
    """Rewrite this process's environment for its xdist worker (idempotent)."""
    base = os.environ.get("REDIS_URL", f"redis://127.0.0.1:6379/{_FIRST_DB}")
    tests_db, spare_db = _databases(worker_index())
    url = _redis_db_url(base, tests_db)
    os.environ["REDIS_URL"] = url
    # The broker and result backend follow REDIS_URL unless set; a set one is moved too.
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        if name in os.environ:
            os.environ[name] = _redis_db_url(os.environ[name], tests_db)
    os.environ["TEST_SPARE_REDIS_URL"] = _redis_db_url(base, spare_db)
    var = os.path.join(tempfile.gettempdir(), f"portal-tests-{os.getuid()}-{worker_name()}")
    os.makedirs(var, exist_ok=True)
    os.environ["PORTAL_VAR_DIR"] = var
