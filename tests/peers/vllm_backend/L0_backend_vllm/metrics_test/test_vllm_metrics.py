"""``vllm_metrics_test.py`` as ``L0_backend_vllm/metrics_test/test.sh`` runs it: each test case
against its own server, with the repository and flags the script sets up for it. See
``tests/peers/vllm_backend/README.md``."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tests.peers.vllm_backend.conftest import (
    BACKEND_DIR,
    add_model,
    edit_model_json,
    start_server,
)
from tests.peers.vllm_backend.runner import run_unittest_case

SERVER_ARGS = [
    BACKEND_DIR,
    "--model-control-mode=explicit",
    "--load-model=vllm_opt",
    "--log-verbose=1",
]
# copy_model_repository: the sample with "gpu_memory_utilization": 0.4
ENGINE_ARGS = {"gpu_memory_utilization": 0.4, "enforce_eager": True}


def no_parameter(config: mc.ModelConfig) -> None:
    """The sample's config.pbtxt has no REPORT_CUSTOM_METRICS (the packager always sets it)."""
    del config.parameters["REPORT_CUSTOM_METRICS"]


def report(value: str) -> Callable[[mc.ModelConfig], None]:
    def edit(config: mc.ModelConfig) -> None:
        config.parameters["REPORT_CUSTOM_METRICS"].string_value = value

    return edit


def stats_off(root: Path) -> None:
    """jq '. += {"disable_log_stats" : true}' models/vllm_opt/1/model.json"""
    edit_model_json(root, "vllm_opt", lambda args: {**args, "disable_log_stats": True})


# (test case, config.pbtxt edit, model.json edit, extra server flags), in test.sh's order.
RUNS = [
    ("VLLMTritonMetricsTest.test_vllm_metrics_disabled", no_parameter, None, []),
    ("VLLMTritonMetricsTest.test_vllm_metrics_disabled", report("false"), None, []),
    ("VLLMTritonMetricsTest.test_vllm_metrics", report("true"), None, []),
    ("VLLMTritonMetricsTest.test_custom_sampling_params", report("true"), None, []),
    ("VLLMTritonMetricsTest.test_vllm_metrics_disabled", report("true"), stats_off, []),
    (
        "VLLMTritonMetricsTest.test_vllm_metrics_refused",
        report("true"),
        None,
        ["--allow-metrics=false"],
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("case", "edit_config", "edit_json", "flags"),
    RUNS,
    ids=[f"{run[0].rsplit('.', 1)[1]}-{i}" for i, run in enumerate(RUNS)],
)
def test_vllm_metrics(
    case: str,
    edit_config: Callable[[mc.ModelConfig], None],
    edit_json: Callable[[Path], None] | None,
    flags: list[str],
    tmp_path: Path,
    peer_demo_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repository = tmp_path / "models"
    add_model(
        repository,
        "vllm_opt",
        str(peer_demo_model),
        engine_args=ENGINE_ARGS,
        edit_config=edit_config,
    )
    if edit_json is not None:
        edit_json(repository)
    # The metrics port is named, so that with --allow-metrics=false the test can check that
    # nothing listens on the very port the server was given.
    metrics_port = _free_port()
    server = start_server(
        repository,
        tmp_path / "vllm_metrics_server.log",
        SERVER_ARGS + flags,
        metrics_port=metrics_port,
    )
    try:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("DEMO_MODEL_DIR", str(peer_demo_model))
        monkeypatch.setenv("TRITON_GRPC_URL", f"localhost:{server.grpc}")
        assert server.metrics == (0 if "--allow-metrics=false" in flags else metrics_port)
        monkeypatch.setenv("TRITON_METRICS_PORT", str(metrics_port))
        run_unittest_case("vllm_metrics_test", case)
    finally:
        server.stop()
