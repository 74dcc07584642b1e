"""The serving image's build-time check, against a stand-in backend and a stand-in vLLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docker" / "check_vllm_backend.py"


def make_fake_vllm(site: Path) -> None:
    """A vLLM with only the V1 metrics modules, like vLLM after 0.11."""
    for package in ("vllm", "vllm/v1", "vllm/v1/metrics"):
        (site / package).mkdir(parents=True, exist_ok=True)
        (site / package / "__init__.py").write_text("")
    (site / "vllm" / "__init__.py").write_text("__version__ = '0.24.0'\nSamplingParams = object\n")
    (site / "vllm/v1/metrics/loggers.py").write_text(
        "StatLoggerBase = object\ndef build_1_2_5_buckets(): ...\n"
    )


def run_check(site: Path, backend: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(backend)],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def test_matching_backend_passes(tmp_path):
    make_fake_vllm(tmp_path / "site")
    backend = tmp_path / "backend"
    (backend / "utils").mkdir(parents=True)
    (backend / "model.py").write_text("import json\nimport vllm\nfrom vllm import SamplingParams\n")
    (backend / "utils" / "metrics.py").write_text(
        "from vllm.v1.metrics.loggers import StatLoggerBase, build_1_2_5_buckets\n"
    )
    result = run_check(tmp_path / "site", backend)
    assert result.returncode == 0, result.stderr
    assert "ok: 4 vLLM imports" in result.stdout


def test_old_backend_against_new_vllm_fails_the_build(tmp_path):
    """Triton 25.09's backend imports vllm.engine.metrics, which newer vLLM removed."""
    make_fake_vllm(tmp_path / "site")
    backend = tmp_path / "backend"
    (backend / "utils").mkdir(parents=True)
    (backend / "model.py").write_text("from vllm import SamplingParams, AsyncEngineArgsGone\n")
    (backend / "utils" / "metrics.py").write_text(
        "from vllm.engine.metrics import StatLoggerBase, Stats\n"
    )
    result = run_check(tmp_path / "site", backend)
    assert result.returncode == 1
    assert "import vllm.engine.metrics" in result.stderr
    assert "from vllm import AsyncEngineArgsGone: no such name" in result.stderr
    assert "pin a compatible pair" in result.stderr


def test_a_directory_without_vllm_imports_is_not_taken_for_the_backend(tmp_path):
    make_fake_vllm(tmp_path / "site")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.py").write_text("import os\n")
    result = run_check(tmp_path / "site", tmp_path / "empty")
    assert result.returncode == 1
    assert "no vLLM imports" in result.stderr
