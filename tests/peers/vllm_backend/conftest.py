"""Run Triton's vLLM-backend CI tests (``ci/`` of triton-inference-server/vllm_backend at
8de0c14, see README.md) against ``python -m serving.kserve`` with the tiny demo model.

Each ``test.sh`` of those tests builds a model repository, starts ``tritonserver`` with its
flags, then runs the Python test with its working directory next to the server log. This file
does the same once per test module: :data:`MODULE_SETUPS` says, per module, which repository
(built with the platform's packager, ``serving.package.vllm_repository_files``, over the demo
model) and which tritonserver flags its ``test.sh`` uses, and :func:`start_server` is the one
place that turns those flags into the CPU engine's command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.demo_model import make_demo_model
from serving.package import vllm_repository_files

from .runner import PEER_FILES, peer_module

PEERS = Path(__file__).resolve().parent
# Triton's python_backend example add_sub, as upstream wrote it (tests/serving/python_backend/).
ADD_SUB = PEERS.parents[1] / "serving" / "python_backend" / "peer_models" / "add_sub"
ROOT = PEERS.parents[2]
# The tests do ``sys.path.append("../../common")`` (relative to their own directory, which is
# where test.sh runs them); under pytest the working directory differs, so put it here.
sys.path.insert(0, str(PEERS / "common"))
sys.path.insert(0, str(PEERS))

# Triton's unittest-style files run through the test_*.py wrappers next to them (runner.py);
# additional_outputs_test.py is pytest-style and collected as it is.
collect_ignore = list(PEER_FILES.values())

READY = re.compile(r"KSERVE READY http=(\d+) grpc=(\d+) metrics=(\d+)")
# The sample model.json (samples/model_repository/vllm_model/1/model.json) without "model",
# which is the demo model here.
SAMPLE_ENGINE_ARGS = {"gpu_memory_utilization": 0.1, "enforce_eager": True}


@dataclass
class Server:
    proc: subprocess.Popen[str]
    http: int
    grpc: int
    metrics: int
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(
    repository: Path, log: Path, server_args: list[str], *, metrics_port: int = 0
) -> Server:
    """``tritonserver --model-repository=DIR <server_args>`` with the CPU engine as the
    executable, on free loopback ports; wait until it is ready.

    ``server_args`` are the test.sh's ``SERVER_ARGS`` as written. Only the ports and addresses
    are added: free ones on 127.0.0.1 (the tests are adapted to read them from the
    environment), so the suite never collides with anything on Triton's default ports.
    ``metrics_port`` fixes the metrics port (to check that nothing listens there)."""
    command = [sys.executable, "-m", "serving.kserve", f"--model-repository={repository}"]
    command += server_args
    ports = {"http": 0, "grpc": 0, "metrics": metrics_port}
    for kind, port in ports.items():
        command += [f"--{kind}-address=127.0.0.1", f"--{kind}-port={port}"]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if match := READY.search(line):
            http, grpc, metrics = map(int, match.groups())
            return Server(proc, http, grpc, metrics, log)
    proc.kill()
    proc.wait()
    raise AssertionError(f"the server did not start:\n{log.read_text()[-4000:]}")


# --- model repositories, as each test.sh builds them --------------------------------------------


def add_model(
    root: Path,
    name: str,
    weights: str,
    *,
    engine_args: dict | None = None,
    edit_config: Callable[[mc.ModelConfig], None] | None = None,
) -> None:
    """``cp -r samples/model_repository/vllm_model models/<name>`` in the packager's layout."""
    args = dict(SAMPLE_ENGINE_ARGS if engine_args is None else engine_args)
    files = vllm_repository_files(name, 1, weights, args)
    # The sample's model.json has no logits processor; the packager always names the
    # platform's, which the CPU engine applies only to requests that carry a constraint.
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    if edit_config is not None:
        config = mc.ModelConfig()
        text_format.Parse((root / name / "config.pbtxt").read_text(), config)
        edit_config(config)
        (root / name / "config.pbtxt").write_text(text_format.MessageToString(config))


def edit_model_json(root: Path, name: str, edit: Callable[[dict], dict]) -> None:
    path = root / name / "1" / "model.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@dataclass
class Setup:
    """One test.sh: its model repository, its server flags, its server log's name, and what
    it runs before starting the server."""

    build: Callable[[Path, str], None]
    log_name: str
    server_args: list[str]
    before_server: Callable[[], None] | None = None

    @property
    def server_key(self) -> str:
        """Setups with the same repository builder and flags start the same server."""
        return f"{self.build.__name__}-{' '.join(self.server_args)}"


def vllm_backend_repository(root: Path, weights: str) -> None:
    """ci/L0_backend_vllm/vllm_backend/test.sh (add_sub from python_backend's examples, as
    test.sh downloads it)."""
    add_model(root, "vllm_opt", weights, engine_args={**SAMPLE_ENGINE_ARGS})
    add_model(root, "vllm_load_test", weights)
    # sed 's/"enforce_eager"/"invalid_attribute"/'
    add_model(root, "vllm_invalid_1", weights)
    edit_model_json(
        root,
        "vllm_invalid_1",
        lambda args: {
            ("invalid_attribute" if k == "enforce_eager" else k): v for k, v in args.items()
        },
    )
    # sed 's/"facebook\/opt-125m"/"invalid_model"/': the weights path is what names the model.
    add_model(root, "vllm_invalid_2", "invalid_model")
    (root / "add_sub" / "1").mkdir(parents=True)
    shutil.copy(ADD_SUB / "config.pbtxt", root / "add_sub" / "config.pbtxt")
    shutil.copy(ADD_SUB / "1" / "model.py", root / "add_sub" / "1" / "model.py")
    ensemble = root / "ensemble_model"
    (ensemble / "1").mkdir(parents=True)
    shutil.copy(
        PEERS / "L0_backend_vllm/vllm_backend/ensemble_config.pbtxt", ensemble / "config.pbtxt"
    )


def sample_repository(root: Path, weights: str) -> None:
    add_model(root, "vllm_opt", weights)


def accuracy_baselines() -> None:
    """``accuracy_test.py --generate-baseline`` and ``--generate-structured-baseline``."""
    module = peer_module("accuracy_test")
    asyncio.run(module.prepare_vllm_baseline_outputs())  # type: ignore[attr-defined]
    asyncio.run(
        module.prepare_vllm_baseline_outputs(  # type: ignore[attr-defined]
            export_file="vllm_structured_baseline_output.pkl",
            prompts=module.STRUCTURED_PROMPTS,  # type: ignore[attr-defined]
            structured_generation=module.StructuredOutputsParams(  # type: ignore[attr-defined]
                choice=["Positive", "Negative"]
            ),
        )
    )


# enabled_stream, request_cancellation and accuracy_test start the same server (the sample
# repository, the same flags): one serves them all. Its log is named as
# request_cancellation_test.py reads it.
_SAMPLE = "request_cancellation_server.log"
# Each test.sh's SERVER_ARGS without --model-repository (BACKEND_DIR=/opt/tritonserver/backends).
BACKEND_DIR = "--backend-directory=/opt/tritonserver/backends"
_SAMPLE_ARGS = [BACKEND_DIR, "--log-verbose=1"]
MODULE_SETUPS: dict[str, Setup] = {
    "test_vllm_backend": Setup(
        vllm_backend_repository,
        "vllm_backend_server.log",
        [BACKEND_DIR, "--model-control-mode=explicit", "--load-model=vllm_opt", "--log-verbose=1"],
    ),
    "test_enabled_stream": Setup(sample_repository, _SAMPLE, _SAMPLE_ARGS),
    "test_request_cancellation": Setup(sample_repository, _SAMPLE, _SAMPLE_ARGS),
    "test_accuracy": Setup(
        sample_repository, _SAMPLE, _SAMPLE_ARGS, before_server=accuracy_baselines
    ),
    # L0_additional_outputs_vllm/test.sh: SERVER_ARGS="--model-repository=models"
    "additional_outputs_test": Setup(sample_repository, _SAMPLE, []),
}


@pytest.fixture(scope="session")
def peer_demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model, as the tests make it, with two choices that fit these tests' prompts:
    2048 positions (as opt-125m) leave room for request_cancellation's 1500 tokens, so the
    request is still running when the client cancels it; and seed 3 is the first seed whose
    greedy output for additional_outputs_test's prompt is "a sentence" there (more than four
    spaces, no EOS within 16 tokens). Seed 0's is sixteen commas."""
    return make_demo_model(
        tmp_path_factory.mktemp("peer-demo") / "weights", seed=3, max_position_embeddings=2048
    )


@dataclass
class Running:
    server: Server
    workdir: Path


@pytest.fixture(scope="session")
def peer_servers() -> Iterator[dict[str, Running]]:
    """Servers by ``Setup.server_key``: the test.sh scripts that start the same server (same
    repository, same flags) share one, started by the first module that needs it."""
    running: dict[str, Running] = {}
    try:
        yield running
    finally:
        for item in running.values():
            item.server.stop()


@pytest.fixture(scope="module", autouse=True)
def peer_server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    peer_demo_model: Path,
    peer_servers: dict[str, Running],
) -> Iterator[Server | None]:
    """The module's server (started with its test.sh's repository and flags, or shared with an
    identical one); its tests run in the server's directory, next to its log."""
    module_name = request.module.__name__.rsplit(".", 1)[-1]
    setup = MODULE_SETUPS.get(module_name)
    if setup is None:
        yield None
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEMO_MODEL_DIR", str(peer_demo_model))
        running = peer_servers.get(setup.server_key)
        if running is None:
            workdir = tmp_path_factory.mktemp(module_name)
            repository = workdir / "models"
            repository.mkdir()
            setup.build(repository, str(peer_demo_model))
            server = start_server(repository, workdir / setup.log_name, setup.server_args)
            running = peer_servers[setup.server_key] = Running(server, workdir)
        server = running.server
        patch.chdir(running.workdir)
        if setup.before_server is not None:
            setup.before_server()
        patch.setenv("TRITON_GRPC_URL", f"localhost:{server.grpc}")
        patch.setenv("TRITON_HTTP_URL", f"localhost:{server.http}")
        patch.setenv("TRITON_METRICS_PORT", str(server.metrics))
        # additional_outputs_test.py names its server in a class attribute, read at import:
        # point it at this one (the file itself is unchanged).
        for value in vars(request.module).values():
            if isinstance(value, type) and "_grpc_url" in vars(value):
                patch.setattr(value, "_grpc_url", f"localhost:{server.grpc}")
        yield server


# --- additional_outputs_test's matrix ------------------------------------------------------------

FULL_MATRIX_ENV = "PEER_TESTS_FULL"


def pairwise_cover(combos: list[dict[str, object]]) -> list[int]:
    """Indexes of a small subset of ``combos`` in which every pair of values of every two
    parameters occurs at least once (greedy all-pairs; deterministic)."""
    keys = sorted(combos[0])

    def pairs(combo: dict[str, object]) -> set[tuple[str, str, str, str]]:
        return {
            (a, repr(combo[a]), b, repr(combo[b]))
            for i, a in enumerate(keys)
            for b in keys[i + 1 :]
        }

    all_pairs = [pairs(c) for c in combos]
    uncovered = set().union(*all_pairs)
    chosen: list[int] = []
    while uncovered:
        best = max(range(len(combos)), key=lambda i: (len(all_pairs[i] & uncovered), -i))
        chosen.append(best)
        uncovered -= all_pairs[best]
    return chosen


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """additional_outputs_test's 1458 parameter combinations take minutes; the normal suite
    runs an all-pairs subset of them (every value of each parameter with every value of each
    other), ``PEER_TESTS_FULL=1`` runs the whole matrix as Triton's CI does."""
    if os.environ.get(FULL_MATRIX_ENV):
        return
    matrix = [
        item
        for item in items
        if item.nodeid.split("::")[0].endswith("additional_outputs_test.py")
        and hasattr(item, "callspec")
    ]
    if not matrix:
        return
    keep = {id(matrix[i]) for i in pairwise_cover([item.callspec.params for item in matrix])}
    deselected = [item for item in matrix if id(item) not in keep]
    items[:] = [item for item in items if item not in deselected or id(item) in keep]
    config.hook.pytest_deselected(items=deselected)
