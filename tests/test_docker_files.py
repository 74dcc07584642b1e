"""Static checks of the container files. No Docker engine runs here, so this checks what can be
checked without one: the files parse, name the expected services, and every command they run
refers to modules and paths that exist in the project."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from celery import Celery
from celery.app.utils import find_app

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def dockerfile_instructions(name: str = "Dockerfile") -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in (DOCKER / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def only(instructions, keyword: str) -> str:
    found = [args for kw, args in instructions if kw == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {found}"
    return found[0]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def command_of(service: dict) -> list[str]:
    command = service["command"]
    if isinstance(command, str):
        return shlex.split(command)
    if command[:2] == ["sh", "-c"]:
        return shlex.split(command[2])
    return list(command)


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_base_user_and_install():
    instructions = dockerfile_instructions()
    assert only(instructions, "FROM") == "python:3.11-slim"
    user = only(instructions, "USER").split(":")[0]
    assert user not in {"root", "0"}
    runs = [args for kw, args in instructions if kw == "RUN"]
    assert any("pip install" in run and " ." in run for run in runs), "installs the project"
    # USER comes after every RUN, so nothing the container runs is root.
    keywords = [kw for kw, _ in instructions]
    assert keywords.index("USER") > max(i for i, kw in enumerate(keywords) if kw == "RUN")


def test_dockerfile_collects_static_with_a_build_only_key():
    instructions = dockerfile_instructions()
    collect = [args for kw, args in instructions if kw == "RUN" and "collectstatic" in args]
    assert len(collect) == 1
    assert "SECRET_KEY=" in collect[0]
    # The key is given to that one command, never baked into the image's environment.
    for kw, args in instructions:
        if kw in {"ENV", "ARG"}:
            assert "SECRET_KEY" not in args


def test_dockerfile_copies_paths_that_exist():
    for kw, args in dockerfile_instructions():
        if kw == "COPY":
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"


def test_dockerfile_cmd_serves_the_asgi_app_on_all_interfaces():
    cmd = json.loads(only(dockerfile_instructions(), "CMD"))
    assert cmd[:2] == ["gunicorn", "portal.asgi:application"]
    assert cmd[cmd.index("--bind") + 1] == "0.0.0.0:8000"
    assert cmd[cmd.index("--config") + 1] == "python:portal.gunicorn_conf"
    assert importlib.util.find_spec("portal.gunicorn_conf") is not None
    assert importlib.util.find_spec("portal.asgi") is not None


def test_collectstatic_works_as_at_build_time(tmp_path):
    """The build step: no database, no Redis, DEBUG off, only a dummy SECRET_KEY."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "DEBUG", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(SECRET_KEY="build-only-not-a-secret", PORTAL_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "staticfiles" / "admin" / "css" / "base.css").exists()


def test_dockerignore_keeps_what_the_build_needs():
    lines = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "var"} <= lines
    needed = {"pyproject.toml", "README.md", "manage.py", "portal", "serving", "templates"}
    assert not needed & lines
    assert "static" not in lines


# --- serving.Dockerfile (the GPU serving image) ------------------------------------------------


def serving_build_checks() -> list[str]:
    runs = [args for kw, args in dockerfile_instructions("serving.Dockerfile") if kw == "RUN"]
    return [run for run in runs if "check_vllm_backend.py" in run]


def test_serving_image_checks_the_backend_and_the_packaged_logits_processors():
    checks = serving_build_checks()
    assert any(
        run.endswith("check_vllm_backend.py /opt/tritonserver/backends/vllm") for run in checks
    )
    assert sum("--model-json" in run for run in checks) == 1


def test_serving_image_registers_the_processor_under_no_entry_point():
    """The image installs pyproject.toml; vLLM would load a ``vllm.logits_processors`` entry
    point into every engine beside the named one (twice for packaged models, and refused under
    async scheduling for any other), so model.json's name is the only registration."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = project.get("entry-points", {})
    assert not any(group.startswith("vllm.") for group in groups), groups
    assert not any(
        "entry_points" in run for _, run in dockerfile_instructions("serving.Dockerfile")
    )


@pytest.mark.slow
def test_serving_image_logits_processor_check_passes_as_at_build_time(tmp_path):
    """The build step, run here against the installed vLLM 0.24.0 and this checkout's serving
    package: only the image's paths and its python3 are swapped for local ones."""
    pytest.importorskip("vllm", reason="vLLM is installed --no-deps in the dev environment")
    (command,) = [run for run in serving_build_checks() if "--model-json" in run]
    local = (
        command.replace(
            "/opt/platform/check_vllm_backend.py", str(DOCKER / "check_vllm_backend.py")
        )
        .replace("/tmp/model.json", str(tmp_path / "model.json"))
        .replace("python3 ", f"{shlex.quote(sys.executable)} ")
    )
    # Every path of the image was swapped (the checkout itself may live anywhere, /tmp too).
    for image_path in ("/opt/platform/check_vllm_backend.py", "/tmp/model.json"):
        assert image_path in command and image_path not in local
    result = subprocess.run(
        ["bash", "-c", local],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "ok: the logits processors" in result.stdout
    assert not (tmp_path / "model.json").exists()  # the step cleans up after itself


# --- compose.yaml -----------------------------------------------------------------------------


def test_compose_services(compose):
    assert set(compose["services"]) == {"portal", "worker", "beat", "redis", "postgres"}
    assert compose["services"]["redis"]["image"] == "redis:7"
    assert compose["services"]["postgres"]["image"] == "postgres:16"
    for name in ("redis", "postgres"):
        assert compose["services"][name]["healthcheck"]["test"]


def test_compose_app_services_share_the_image_and_settings(compose):
    services = compose["services"]
    for name in ("portal", "worker", "beat"):
        service = services[name]
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        assert (ROOT / "docker" / service["build"]["context"] / "docker/Dockerfile").exists()
        env = service["environment"]
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
        assert env["DATABASE_URL"].startswith("postgres://")
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert env["DEBUG"] == "0"
        assert env["SECURE_COOKIES"] == "0"
        assert "localhost" in env["ALLOWED_HOSTS"].split(",")
        for dependency in ("postgres", "redis"):
            assert service["depends_on"][dependency]["condition"] == "service_healthy"


def test_compose_commands_reference_real_entry_points(compose):
    services = compose["services"]
    web = command_of(services["portal"])
    assert web[:4] == ["python", "manage.py", "migrate", "--noinput"]
    assert web[web.index("&&") + 1 :][:3] == ["exec", "gunicorn", "portal.asgi:application"]
    assert "0.0.0.0:8000" in web
    assert web[web.index("--config") + 1] == "python:portal.gunicorn_conf"
    assert command_of(services["worker"])[:4] == ["celery", "-A", "portal", "worker"]
    assert command_of(services["beat"])[:4] == ["celery", "-A", "portal", "beat"]
    # What ``celery -A portal`` resolves to is the project's Celery app.
    app = find_app("portal")
    assert isinstance(app, Celery)
    assert app.main == "portal"


def test_compose_model_cache_volume_is_mounted_at_model_cache_root(compose):
    assert "model-cache" in compose["volumes"]
    for name in ("portal", "worker"):
        service = compose["services"][name]
        cache_root = service["environment"]["MODEL_CACHE_ROOT"]
        assert f"model-cache:{cache_root}" in service["volumes"]
