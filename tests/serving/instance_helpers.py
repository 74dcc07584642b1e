"""Test helpers for the instance: model packages built the way the portal builds them.

The archive and the manifest's ``files`` list come from :mod:`serving.package` (what
``portal.registry.packaging`` uses); the rest of the manifest mirrors ``manifest_for``, which
cannot be imported here (serving and its tests stay free of Django).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.package import MANIFEST_FORMAT, archive_bytes, file_entries
from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def repository_files(weights: Path, name: str, version: int = 1, **engine_args: Any) -> dict:
    """``<name>/config.pbtxt`` + ``<name>/<version>/model.json`` of a vLLM-backend version."""
    config = (
        f'name: "{name}"\nbackend: "vllm"\nmax_batch_size: 0\n'
        "model_transaction_policy {\n  decoupled: true\n}\n"
        "instance_group {\n  count: 1\n  kind: KIND_MODEL\n}\n"
        f"version_policy {{\n  specific {{\n    versions: {version}\n  }}\n}}\n"
        'parameters {\n  key: "REPORT_CUSTOM_METRICS"\n  value {\n    string_value: "true"\n  }\n}\n'
    )
    args = {
        "model": str(weights),
        "tokenizer": str(weights),
        "disable_log_stats": False,
        **engine_args,
        "logits_processors": ["serving.constraints.vllm_v1:ConstraintLogitsProcessor"],
    }
    return {
        f"{name}/config.pbtxt": config.encode(),
        f"{name}/{version}/model.json": (
            json.dumps(args, sort_keys=True, indent=2) + "\n"
        ).encode(),
    }


def manifest(files: dict, name: str, weights: Path, version: int = 1, **overrides: Any) -> dict:
    api_surface = overrides.pop("api_surface", "openai+grpc")
    return {
        "format": MANIFEST_FORMAT,
        "model": name,
        "version": version,
        "backend": "vllm",
        "api_surface": api_surface,
        "triton_embedded": api_surface == "openai+grpc",
        "constraint_plugins": ["platform-constraints"],
        "release": {"name": "test", "triton_image": "none", "vllm_version": "0.24.0"},
        "weights": str(weights),
        "created_at": "2026-01-01T00:00:00+00:00",
        "files": file_entries(files),
        **overrides,
    }


def build_package(
    path: Path,
    weights: Path,
    *,
    name: str = "demo--tiny",
    corrupt: bool = False,
    engine_args: dict | None = None,
    **manifest_overrides: Any,
) -> Path:
    """Write a package tar to ``path``. ``corrupt``: one file's bytes change after the manifest
    recorded its checksum (same size), as a damaged download would."""
    files = repository_files(weights, name, **(engine_args or {"max_num_seqs": 4}))
    meta = manifest(files, name, weights, **manifest_overrides)
    if corrupt:
        key = f"{name}/config.pbtxt"
        files[key] = files[key].replace(b"vllm", b"vLLM")
    path.write_bytes(archive_bytes(files, meta))
    return path


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Instance:
    """``python -m serving.instance`` as a real subprocess, its stderr JSON lines collected."""

    def __init__(
        self, package: Path, workdir: Path, env: dict[str, str] | None = None, **options: Any
    ) -> None:
        self.ports = {
            k: options.pop(k, None) or free_port()
            for k in ("openai_port", "http_port", "grpc_port", "metrics_port")
        }
        argv = [
            sys.executable, "-m", "serving.instance",
            "--package", str(package), "--workdir", str(workdir),
            *(f"--{k.replace('_', '-')}={v}" for k, v in {**self.ports, **options}.items()),
        ]  # fmt: skip
        base = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env={**base, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.events: list[dict] = []
        self.stderr: list[str] = []
        self.stdout: list[str] = []
        self._ready = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            with self._lock:
                self.stderr.append(line)
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        self.events.append({**json.loads(line), "_seen": time.monotonic()})

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            with self._lock:
                self.stdout.append(line)
            if line.startswith("INSTANCE READY"):
                self._ready.set()

    def wait_ready(self, timeout: float = 180.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"instance not ready (exit {self.proc.poll()}):\n{self.log()}")
        line = next(s for s in self.stdout if s.startswith("INSTANCE READY"))
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}

    def steps(self) -> list[str]:
        with self._lock:
            return [e["step"] for e in self.events if e.get("event") == "step"]

    def step(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """The step's logged event. Steps are logged on stderr and ``INSTANCE READY`` on
        stdout, each read by its own thread, so a step just before READY may still be on its
        way when READY is seen: wait a little for it."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = next(
                    (e for e in self.events if e.get("event") == "step" and e["step"] == name),
                    None,
                )
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no step {name!r} logged:\n{self.log()}")
            time.sleep(0.05)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if result := predicate():
                return result
            time.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        with self._lock:
            return "\n".join(self.stderr[-60:])

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


# A real engine-side writer: VllmMetrics in its own process, PROMETHEUS_MULTIPROC_DIR set before
# prometheus_client is imported, fed through the EngineStats hooks the engine calls.
_WRITER = """
import json, sys
from serving.engine.stats import FinishedRequest
from serving.metrics.vllm_metrics import VllmMetrics
for spec in json.loads(sys.argv[1]):
    m = VllmMetrics(spec["model"], max_model_len=spec.get("max_model_len"))
    for _ in range(spec.get("requests", 1)):
        m.on_prefill(7, 7, 0)
        m.on_first_token(0.05)
        m.on_tokens(1, [])
        m.on_scheduler_step(1, 2, 0.25)
        m.on_tokens(1, [0.02])
        m.on_tokens(1, [0.03])
        m.on_scheduler_step(0, 0, 0.0)
        m.on_finished(FinishedRequest("stop", 7, 3, 16, 1, 0.01, 0.04, 0.05, 0.09, 0.1))
"""


def write_vllm_metrics(multiproc_dir: Path, *specs: dict[str, Any]) -> None:
    """Run one writer process; each spec: ``{"model": name, "requests": k, "max_model_len": n}``."""
    multiproc_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir)}
    subprocess.run(
        [sys.executable, "-c", _WRITER, json.dumps(list(specs))],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=120,
    )


def plugin_entry(
    wheel: Path,
    name: str,
    *,
    version: str = "1.0.0",
    general_plugins: dict[str, str] | None = None,
    logits_processors: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One author plugin for :func:`build_plugin_package`: its wheel and what the portal's
    packager would read from it (``name``, ``version``, entry points by group)."""
    return {
        "wheel": wheel,
        "name": name,
        "version": version,
        "general_plugins": dict(general_plugins or {}),
        "logits_processors": dict(logits_processors or {}),
    }


def build_plugin_package(
    path: Path,
    weights: Path,
    plugins: list[dict[str, Any]],
    *,
    name: str = "demo--tiny",
    name_in_model_json: bool = True,
    **manifest_overrides: Any,
) -> Path:
    """A package carrying author plugin wheels the way the portal's packager writes them: each
    wheel at ``<name>/plugins/<wheel filename>`` (so in ``files`` with its sha256), the manifest's
    ``plugins`` list, and each logits processor named in model.json after the platform's."""
    files = repository_files(weights, name, max_num_seqs=4)
    entries = []
    for plugin in plugins:
        wheel: Path = plugin["wheel"]
        data = wheel.read_bytes()
        member = f"{name}/plugins/{wheel.name}"
        files[member] = data
        entries.append(
            {
                "file": member,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "name": plugin["name"],
                "version": plugin["version"],
                "general_plugins": dict(sorted(plugin["general_plugins"].items())),
                "logits_processors": dict(sorted(plugin["logits_processors"].items())),
            }
        )
    if name_in_model_json:
        key = f"{name}/1/model.json"
        args = json.loads(files[key])
        args["logits_processors"] += [
            value for plugin in plugins for _, value in sorted(plugin["logits_processors"].items())
        ]
        files[key] = (json.dumps(args, sort_keys=True, indent=2) + "\n").encode()
    meta = manifest(files, name, weights, plugins=entries, **manifest_overrides)
    path.write_bytes(archive_bytes(files, meta))
    return path
