"""Shared fixtures: teams with a member, a viewer and an outsider; tokens; API clients; and a real
Celery worker process against the test database and a dedicated Redis database."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from portal.accounts.models import Membership, Role, Team
from portal.accounts.tokens import issue_token
from portal.deployments.models import InstanceType
from portal.registry.models import PlatformRelease
from portal.registry.validation import ENGINE_ARG_TYPES
from tests.factories import make_deployment, make_model, make_version

ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def pytest_configure(config):
    """Give this run a Celery queue of its own. A worker left behind by an earlier run that was
    killed (its teardown never ran) still listens on the same Redis database, and would
    otherwise take this run's tasks and act on them with its own settings."""
    queue = f"test-{socket.gethostname()}-{os.getpid()}"
    os.environ["CELERY_QUEUE"] = queue  # the workers the tests start inherit it
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    from portal.celery import app

    app.conf.task_default_queue = queue
    # Tests speak plain HTTP, to the test client and to the processes they start, with DEBUG
    # off; the production default would redirect every request to https://.
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    settings.SECURE_SSL_REDIRECT = False


#: The xdist group of the tests that run whole platforms (a Celery worker, a gateway and instances
#: as processes): ``--dist loadgroup`` runs them on one worker, one after another. Two at once on
#: two cores starve each other's instances (a rollout test took 4x as long beside another).
PLATFORM_GROUP = "platform"
#: Triton's OpenAI front-end suite, run in its own order on one worker: its server's engine
#: seeds unseeded requests from one seeded stream, so the same order of requests samples the
#: same tokens every run. Spread over two workers, the order changed with the load, and a test
#: that needs a non-empty answer failed now and then (an empty one has p of about 0.002).
OPENAI_PEERS_GROUP = "peers-openai"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Group the tests that use the rollout world, and mark the peers' suites slow (their files
    stay as their projects wrote them, so the mark is given here)."""
    peers = ROOT / "tests" / "peers"
    for item in items:
        if "rollout_world" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(PLATFORM_GROUP))
        if peers in item.path.parents:
            item.add_marker(pytest.mark.slow)
        if peers / "openai_frontend" in item.path.parents:
            item.add_marker(pytest.mark.xdist_group(OPENAI_PEERS_GROUP))


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Test users need no slow password hashing; it would dominate the API tests' run time."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _artifact_root(settings, tmp_path):
    root = tmp_path / "artifacts"
    root.mkdir()
    settings.ARTIFACT_FILE_ROOTS = [root.resolve()]
    # Most tests register sources they never copy; tests/registry/test_fail_early.py turns the
    # existence check on.
    settings.ARTIFACT_FILE_CHECK_ON_REGISTER = False
    return root


@pytest.fixture(autouse=True)
def _model_cache_root(settings, tmp_path):
    settings.MODEL_CACHE_ROOT = tmp_path / "model-cache"
    settings.HF_HUB_CACHE_DIR = tmp_path / "hf-hub"


@pytest.fixture
def artifact_root(_artifact_root):
    return _artifact_root


@pytest.fixture
def release(db):
    release, _ = PlatformRelease.objects.get_or_create(
        name="triton-26.07",
        defaults={
            "triton_image": "nvcr.io/nvidia/tritonserver:26.07-vllm-python-py3",
            "vllm_version": "0.24.0",
            "allowed_engine_args": sorted(ENGINE_ARG_TYPES),
            "is_default": True,
        },
    )
    return release


@pytest.fixture
def cpu_instance_type(db):
    instance_type, _ = InstanceType.objects.get_or_create(name="cpu-local")
    return instance_type


@pytest.fixture
def model(team):
    """A model of the ``team`` fixture, registered through the service."""
    return make_model(team, "ranker")


@pytest.fixture
def version(model, release, artifact_root):
    return make_version(model, artifact_root)


@pytest.fixture
def deployment(model, version, cpu_instance_type):
    return make_deployment(model, version, cpu_instance_type)


def _user(username: str, team: Team | None, role: str):
    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    if team is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


@pytest.fixture
def team(db):
    return Team.objects.create(slug="search", name="Search")


@pytest.fixture
def other_team(db):
    return Team.objects.create(slug="ads", name="Ads")


@pytest.fixture
def member(team):
    return _user("mia", team, Role.MEMBER)


@pytest.fixture
def viewer(team):
    return _user("vic", team, Role.VIEWER)


@pytest.fixture
def outsider(other_team):
    return _user("otto", other_team, Role.MEMBER)


@pytest.fixture
def member_token(team, member):
    return issue_token(team=team, name="ci", role=Role.MEMBER, created_by=member).plaintext


@pytest.fixture
def viewer_token(team, member):
    return issue_token(team=team, name="dashboards", role=Role.VIEWER, created_by=member).plaintext


@pytest.fixture
def revoked_token(team, member):
    issued = issue_token(team=team, name="old", created_by=member)
    issued.token.revoked_at = timezone.now()
    issued.token.save()
    return issued.plaintext


@pytest.fixture
def expired_token(team, member):
    return issue_token(
        team=team, name="stale", created_by=member, expires_at=timezone.now() - timedelta(minutes=1)
    ).plaintext


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def api():
    """``api(token_or_user)``: an API client acting as a token (str) or a signed-in user."""

    def make(who=None) -> APIClient:
        if who is None:
            return APIClient()
        return bearer(who) if isinstance(who, str) else session(who)

    return make


# --- Real services --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_client():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.ping()
    return client


@pytest.fixture
def clean_redis(redis_client):
    redis_client.flushdb()
    yield redis_client
    redis_client.flushdb()


def _test_database_url() -> str:
    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        pytest.skip("the worker-process tests need PostgreSQL (DATABASE_URL)")
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    user = db.get("USER") or "postgres"
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


def die_with_pytest() -> None:
    """``preexec_fn`` for the processes tests start: the kernel sends them SIGTERM when the
    pytest process dies, so a run killed midway (a timeout, a Ctrl-C twice) leaves no worker or
    gateway behind to take the next run's tasks."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_celery_worker(name: str = "test") -> subprocess.Popen:
    """A real ``celery worker`` process on the test database and the test Redis database,
    with this process's environment (so a test's ``monkeypatch.setenv`` reaches it)."""
    env = {
        **os.environ,
        "DATABASE_URL": _test_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_RESULT_BACKEND": settings.CELERY_RESULT_BACKEND,
    }
    hostname = f"{name}-{os.getpid()}-{time.monotonic_ns()}@{socket.gethostname()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
            "--hostname",
            hostname,
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_pytest,
    )
    from portal.celery import app

    deadline = time.monotonic() + 30
    while not app.control.ping(destination=[hostname], timeout=0.5):  # this worker, no other
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the Celery worker did not come up")
    return proc


def stop_process_group(
    proc: subprocess.Popen, first: signal.Signals = signal.SIGTERM, grace: float = 20
) -> None:
    """Signal a process started in its own session (a worker, a gateway, ``./dev``) with
    ``first``, and SIGKILL its group if it has not exited ``grace`` seconds later."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, first)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        warnings.warn(
            f"{' '.join(map(str, proc.args))[:200]} had not exited {grace:.0f} s after "
            f"{first.name}; killed",
            stacklevel=2,
        )


@pytest.fixture
def celery_worker_process(transactional_db, clean_redis):
    """A real worker for the test; fixtures that set its environment must come before it."""
    proc = start_celery_worker()
    yield proc
    stop_process_group(proc)


@pytest.fixture
def worker_cache(monkeypatch, settings, tmp_path, artifact_root):
    """The model cache and artifact roots, in this process's settings and in the environment
    a worker process started afterwards reads them from."""
    root = tmp_path / "model-cache"
    monkeypatch.setenv("MODEL_CACHE_ROOT", str(root))
    monkeypatch.setenv("ARTIFACT_FILE_ROOTS", str(artifact_root))
    monkeypatch.setenv("HF_HUB_CACHE_DIR", str(tmp_path / "hf-hub"))
    settings.MODEL_CACHE_ROOT = root
    settings.HF_HUB_CACHE_DIR = tmp_path / "hf-hub"
    return root
