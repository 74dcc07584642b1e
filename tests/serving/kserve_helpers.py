"""Start ``python -m serving.kserve`` as a real subprocess and build vLLM-backend tensors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

READY = re.compile(r"KSERVE READY http=(\d+) grpc=(\d+) metrics=(\d+)")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class KServeProcess:
    proc: subprocess.Popen[str]
    http: int
    grpc: int
    metrics: int
    log: Path

    @property
    def multiproc_dir(self) -> Path:
        """Where the server's vLLM-named metrics land (``PROMETHEUS_MULTIPROC_DIR``)."""
        return self.log.parent / "prometheus"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http}"

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def kserve_env(tmp: Path) -> dict[str, str]:
    multiproc = tmp / "prometheus"
    multiproc.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "PYTHONPATH": str(ROOT),
    }


def launch(repository: Path, tmp: Path, *args: str) -> subprocess.Popen[str]:
    log = tmp / "kserve.log"
    command = [sys.executable, "-m", "serving.kserve", "--model-repository", str(repository)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *args]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=kserve_env(tmp),
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )


def start_kserve(repository: Path, tmp: Path, *args: str, timeout: float = 180) -> KServeProcess:
    """Launch and wait for the READY line; fail with the server's log if it never comes."""
    proc = launch(repository, tmp, *args)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:  # stdout closed: the process exited
            break
        if match := READY.search(line):
            http, grpc, metrics = map(int, match.groups())
            return KServeProcess(proc, http, grpc, metrics, tmp / "kserve.log")
    proc.kill()
    proc.wait()
    raise AssertionError(f"kserve did not start:\n{(tmp / 'kserve.log').read_text()[-4000:]}")


def bytes_input(name: str, value: str | bytes) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    raw = value.encode() if isinstance(value, str) else value
    tensor.set_data_from_numpy(np.array([raw], dtype=np.object_))
    return tensor


def bool_input(name: str, value: bool) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def generate_inputs(
    prompt: str,
    sampling: dict[str, Any] | None = None,
    *,
    stream: bool = False,
    exclude_input: bool | None = True,
    returns: tuple[str, ...] = ("finish_reason", "num_input_tokens", "num_output_tokens"),
) -> list[grpcclient.InferInput]:
    """The inputs Triton's OpenAI front end sends to a vLLM-backend model."""
    inputs = [bytes_input("text_input", prompt), bool_input("stream", stream)]
    if sampling is not None:
        inputs.append(bytes_input("sampling_parameters", json.dumps(sampling)))
    if exclude_input is not None:
        inputs.append(bool_input("exclude_input_in_output", exclude_input))
    inputs += [bool_input(f"return_{name}", True) for name in returns]
    return inputs


def text_of(result: Any, name: str = "text_output") -> str:
    value = result.as_numpy(name).reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def count_of(result: Any, name: str) -> int:
    return int(np.asarray(result.as_numpy(name)).reshape(-1)[0])


def is_final(result: Any) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param
