"""Settings come from the environment, with safe defaults for the embedded setup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

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


PRINT_HTTPS_SETTINGS = (
    "import django; django.setup(); from django.conf import settings as s; "
    "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
    "s.SECURE_HSTS_PRELOAD, s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_SECURE, sep='|')"
)
PRODUCTION = {"SECRET_KEY": "x" * 20 + "-production-like-key-of-fifty-chars-or-more"}


def https_settings(tmp_path: Path, **env: str) -> list[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SECURE_") and k not in {"DATABASE_URL", "DEBUG", "SECRET_KEY"}
    }
    base.update(
        DJANGO_SETTINGS_MODULE="portal.settings", PORTAL_VAR_DIR=str(tmp_path / "var"), **env
    )
    result = subprocess.run(
        [sys.executable, "-c", PRINT_HTTPS_SETTINGS],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split("|")


def test_https_is_enforced_by_default_when_debug_is_off(tmp_path):
    assert https_settings(tmp_path, **PRODUCTION) == [
        "True", "31536000", "True", "False", "('HTTP_X_FORWARDED_PROTO', 'https')", "True",
    ]  # fmt: skip


def test_plain_http_setups_turn_https_off(tmp_path):
    """./dev run sets DEBUG=1, docker/compose.yaml SECURE_COOKIES=0: both serve plain HTTP on
    127.0.0.1, where a redirect to https:// or an HSTS header would lock the browser out."""
    off = ["False", "0", "False", "False", "None", "False"]
    assert https_settings(tmp_path, DEBUG="1") == off
    assert https_settings(tmp_path, SECURE_COOKIES="0", **PRODUCTION) == off


def test_each_https_setting_has_its_own_variable(tmp_path):
    assert https_settings(
        tmp_path,
        SECURE_SSL_REDIRECT="0",
        SECURE_HSTS_SECONDS="600",
        SECURE_HSTS_INCLUDE_SUBDOMAINS="0",
        SECURE_HSTS_PRELOAD="1",
        SECURE_PROXY_SSL_HEADER="X-Scheme",
        **PRODUCTION,
    ) == ["False", "600", "False", "True", "('HTTP_X_SCHEME', 'https')", "True"]
    assert https_settings(tmp_path, SECURE_PROXY_SSL_HEADER="", **PRODUCTION)[4] == "None"


def test_deploy_check_is_clean_with_production_settings(tmp_path):
    """``manage.py check --deploy`` with what production sets: DEBUG off, a long random key."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SECURE_") and k not in {"DATABASE_URL", "DEBUG", "SECRET_KEY"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        PORTAL_VAR_DIR=str(tmp_path / "var"),
        SECRET_KEY="k7Qz-p2Vd9xWm4RtB8yLc1NfH6sJ0gUa3EoZiK5vXbT_qYwMnPr",
    )
    call = (
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('check', deploy=True, fail_level='WARNING')"
    )
    result = subprocess.run(
        [sys.executable, "-c", call], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.django_db
def test_probes_are_not_redirected_to_https(settings):
    """Kubernetes probes and the metrics scraper call over plain HTTP inside the cluster."""
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()  # its handler reads the security settings when it is built
    for path in ("/healthz", "/livez", "/metrics"):
        assert client.get(path).status_code != 301, path
    response = client.get("/api/v1/teams/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/api/v1/teams/"
    assert client.get("/api/v1/teams/", HTTP_X_FORWARDED_PROTO="https").status_code == 401
