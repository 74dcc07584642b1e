"""Both engines started as the supervisor starts them: the tritonserver engine (its executable
replaced by a script that records its argv and runs the CPU engine with it) and the CPU engine's
explicit model control."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import httpx
import pytest

from serving.instance.engines import EnginePorts, tritonserver_args
from serving.instance.supervisor import ManifestError, check_manifest
from tests.ports import free_port
from tests.serving.conftest import MODEL_NAME, write_repository
from tests.serving.instance_helpers import Instance, build_package
from tests.serving.kserve_helpers import start_kserve

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast


def fake_tritonserver(directory: Path) -> tuple[Path, Path]:
    """An executable named ``tritonserver`` that writes its argv to a file and then runs the
    CPU engine with exactly those arguments."""
    argv_file = directory / "argv.txt"
    script = directory / "tritonserver"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$@\" > '{argv_file}'\n"
        f"exec '{sys.executable}' -m serving.kserve \"$@\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, argv_file


def test_the_tritonserver_engine_runs_its_command_line_and_is_ready_by_health(
    tmp_path, demo_model_dir
):
    package = build_package(tmp_path / "pkg.tar", demo_model_dir, constraint_plugins=[])
    script, argv_file = fake_tritonserver(tmp_path)
    instance = Instance(
        package,
        tmp_path / "work",
        env={"TRITONSERVER_BIN": str(script)},
        engine="tritonserver",
        drain_timeout=7,
    )
    try:
        ports = instance.wait_ready(240)
        started = instance.step("start_engine")
        assert started["engine"] == "tritonserver"
        assert started["command"][0] == str(script)
        expected = tritonserver_args(
            (tmp_path / "work" / "repository").resolve(),
            MODEL_NAME,
            host="127.0.0.1",
            ports=EnginePorts(ports["http"], ports["grpc"], ports["metrics"]),
            drain_timeout=7,
        )
        assert argv_file.read_text().splitlines() == expected == started["command"][1:]
        base = f"http://127.0.0.1:{ports['http']}"
        assert httpx.get(f"{base}/v2/health/ready").status_code == 200
        assert httpx.get(f"{base}/v2/models/{MODEL_NAME}/ready").status_code == 200
        answer = httpx.post(
            f"http://127.0.0.1:{ports['openai']}/v1/completions",
            json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 3},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
    finally:
        assert instance.stop() == 0, instance.log()


def test_explicit_model_control_loads_only_the_named_model_and_metrics_can_be_off(
    tmp_path, demo_model_dir
):
    repository = write_repository(tmp_path / "repo", demo_model_dir)
    broken = write_repository(tmp_path / "repo", demo_model_dir, name="other") / "other"
    (broken / "config.pbtxt").write_text('backend: "python"\n')  # would refuse the start
    metrics_port = free_port()
    server = start_kserve(
        repository,
        tmp_path,
        "--model-control-mode=explicit",
        f"--load-model={MODEL_NAME}",
        "--allow-metrics=false",
        f"--metrics-port={metrics_port}",
    )
    try:
        assert server.metrics == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        base = f"http://127.0.0.1:{server.http}"
        assert httpx.get(f"{base}/v2/health/ready").status_code == 200
        assert httpx.get(f"{base}/v2/models/{MODEL_NAME}/ready").status_code == 200
        assert httpx.get(f"{base}/v2/models/other/ready").status_code != 200
    finally:
        server.proc.terminate()
        server.proc.wait(60)


def test_a_model_named_for_loading_that_the_repository_lacks_stops_the_start(
    tmp_path, demo_model_dir
):
    repository = write_repository(tmp_path / "repo", demo_model_dir)
    with pytest.raises(AssertionError, match="has no model"):
        start_kserve(repository, tmp_path, "--model-control-mode=explicit", "--load-model=nope")


def test_each_engine_serves_only_the_backends_it_has():
    manifest = {"model": "m", "backend": "python", "api_surface": "grpc"}
    assert check_manifest(dict(manifest), "tritonserver")["backend"] == "python"
    assert check_manifest(dict(manifest), "cpu")["backend"] == "python"  # issue 18 item 2
    other = {**manifest, "backend": "onnxruntime"}
    with pytest.raises(ManifestError, match="the cpu engine serves only vllm and python-backend"):
        check_manifest(other, "cpu")
