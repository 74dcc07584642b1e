"""Settings come from the environment, with safe defaults for the embedded setup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRINT_SETTINGS = (
    "import django; django.setup(); from django.conf import settings as s; "
    "print(s.DATABASES['default']['ENGINE'], s.DATABASES['default']['NAME'], "
    "s.CELERY_BROKER_URL, s.CELERY_TASK_DEFAULT_QUEUE, s.MODEL_CACHE_ROOT, s.DEBUG, sep='|')"
)


def run_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "MODEL_CACHE_ROOT",
                     "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "CELERY_QUEUE"}
    }  # fmt: skip
    base.update(
        DJANGO_SETTINGS_MODULE="portal.settings", PORTAL_VAR_DIR=str(tmp_path / "var"), **env
    )
    return subprocess.run(
        [sys.executable, "-c", PRINT_SETTINGS], cwd=ROOT, env=base, capture_output=True, text=True
    )


def test_secret_key_is_required_when_debug_is_off(tmp_path):
    result = run_settings(tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_embedded_defaults(tmp_path):
    result = run_settings(tmp_path, DEBUG="1")
    assert result.returncode == 0, result.stderr
    engine, name, broker, queue, cache_root, debug = result.stdout.strip().split("|")
    assert engine == "django.db.backends.sqlite3"
    assert name == str(tmp_path / "var" / "portal.sqlite3")
    assert broker == "redis://127.0.0.1:6379/0"
    assert queue == "celery"
    assert cache_root == str(tmp_path / "var" / "model-cache")
    assert debug == "True"
    # The generated development key is kept, private, and reused.
    key_file = tmp_path / "var" / "secret_key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    first = key_file.read_text()
    run_settings(tmp_path, DEBUG="1")
    assert key_file.read_text() == first


def test_environment_overrides(tmp_path):
    result = run_settings(
        tmp_path,
        SECRET_KEY="s3cret",
        DATABASE_URL="postgres://u@db.internal:5433/portal",
        REDIS_URL="redis://cache:6379/2",
        MODEL_CACHE_ROOT="/fsx/models",
        CELERY_QUEUE="platform-b",
    )
    assert result.returncode == 0, result.stderr
    engine, name, broker, queue, cache_root, debug = result.stdout.strip().split("|")
    assert (engine, name) == ("django.db.backends.postgresql", "portal")
    assert broker == "redis://cache:6379/2"
    assert queue == "platform-b"
    assert cache_root == "/fsx/models"
    assert debug == "False"


def test_the_embedded_sqlite_waits_for_the_write_lock_instead_of_failing(tmp_path):
    """Two writers at once (worker tasks, the web server) must queue, not fail with "database
    is locked": immediate transactions with a busy timeout, in WAL mode."""
    check = (
        "import django; django.setup(); from django.db import connection; "
        "from django.conf import settings as s; o = s.DATABASES['default']['OPTIONS']; "
        "print(o['transaction_mode'], o['timeout'], sep='|'); "
        "c = connection.cursor(); c.execute('PRAGMA journal_mode'); print(c.fetchone()[0])"
    )
    base = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY"}}
    base.update(
        DJANGO_SETTINGS_MODULE="portal.settings", PORTAL_VAR_DIR=str(tmp_path / "var"), DEBUG="1"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, env=base, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["IMMEDIATE|20", "wal"]
