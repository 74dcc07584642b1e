"""The serving image's build-time check: its backend-import half against a stand-in backend and
a stand-in vLLM, its logits-processor half against the installed vLLM 0.24.0."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.constraints import LOGITS_PROCESSOR
from serving.package import vllm_repository_files

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


# --- the logits processors model.json names, against the installed vLLM 0.24.0 ----------------


def load_check_module():
    spec = importlib.util.spec_from_file_location("check_vllm_backend", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def packaged_model_json() -> dict:
    files = vllm_repository_files("team--model", 1, "/weights", {"dtype": "half"})
    return json.loads(files["team--model/1/model.json"])


def test_the_packaged_constraint_processor_loads_against_vllm():
    pytest.importorskip("vllm", reason="vLLM is installed --no-deps in the dev environment")
    model_json = packaged_model_json()
    assert model_json["logits_processors"] == [LOGITS_PROCESSOR]
    assert load_check_module().logits_processor_problems(model_json) == []


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (
            ["serving.constraints.no_such_module:ConstraintLogitsProcessor"],
            "No module named 'serving.constraints.no_such_module'",
        ),
        (["serving.constraints.vllm_v1:NoSuchClass"], "has no attribute 'NoSuchClass'"),
        (
            ["serving.constraints.vllm_v1.ConstraintLogitsProcessor"],
            "must be a qualified name 'package.module:Class'",
        ),
        (["json:dumps"], "dumps is not a class"),
        (["json:JSONDecoder"], "JSONDecoder is not a subclass of vLLM's LogitsProcessor"),
        ([], "names no logits_processors"),
    ],
)
def test_a_logits_processor_vllm_could_not_load_is_named(names, problem):
    pytest.importorskip("vllm", reason="vLLM is installed --no-deps in the dev environment")
    problems = load_check_module().logits_processor_problems({"logits_processors": names})
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.slow
def test_model_json_mode_fails_the_build_on_a_bad_processor(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is installed --no-deps in the dev environment")
    path = tmp_path / "model.json"
    path.write_text(
        json.dumps({**packaged_model_json(), "logits_processors": ["json:JSONDecoder"]})
    )
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--model-json", str(path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert f"{path}: logits processor 'json:JSONDecoder'" in result.stderr
