"""VllmMetrics: written by real processes in multiprocess mode, read back as vLLM names them."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.metrics.unified import merge, read_multiprocess
from tests.serving.instance_helpers import REPO_ROOT, write_vllm_metrics

EXPECTED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
}


@pytest.fixture(scope="module")
def multiproc(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("prometheus")
    # Two processes write the same model (values add up) and one of them a second model too.
    write_vllm_metrics(directory, {"model": "a", "max_model_len": 100, "requests": 2})
    write_vllm_metrics(directory, {"model": "a", "max_model_len": 100}, {"model": "b"})
    return directory


@pytest.fixture(scope="module")
def families(multiproc):
    text = merge(None, read_multiprocess(multiproc))
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, name: str, sample: str, **labels: str) -> float:
    for s in families[name].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample} {labels}")


def test_every_family_with_vllm_type_and_labels(families):
    vllm = {name: f.type for name, f in families.items() if name.startswith("vllm:")}
    assert vllm == EXPECTED
    for name in EXPECTED:
        for sample in families[name].samples:
            expected = {"model_name", "engine"} | (
                {"finished_reason"} if name == "vllm:request_success" else set()
            )
            assert set(sample.labels) - {"le"} == expected, (name, sample)
            assert sample.labels["engine"] == "0"


def test_values_from_two_processes_add_up(families):
    assert value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total", model_name="a") == 21
    assert value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total", model_name="b") == 7
    assert (
        value(families, "vllm:generation_tokens", "vllm:generation_tokens_total", model_name="a")
        == 9
    )
    success = "vllm:request_success_total"
    assert (
        value(families, "vllm:request_success", success, finished_reason="stop", model_name="a")
        == 3
    )
    for reason in ("length", "abort", "error", "repetition"):  # pre-created, as vLLM does
        assert (
            value(families, "vllm:request_success", success, finished_reason=reason, model_name="a")
            == 0
        )
    ttft = "vllm:time_to_first_token_seconds"
    assert value(families, ttft, ttft + "_count", model_name="a") == 3
    assert value(families, ttft, ttft + "_bucket", model_name="a", le="0.04") == 0
    assert value(families, ttft, ttft + "_bucket", model_name="a", le="0.06") == 3
    itl = "vllm:inter_token_latency_seconds"
    assert value(families, itl, itl + "_count", model_name="a") == 6
    # vLLM's time per output token leaves the prefill's token out: 0.05 s / (3 - 1).
    tpot = "vllm:request_time_per_output_token_seconds"
    assert value(families, tpot, tpot + "_sum", model_name="b") == pytest.approx(0.025)
    it = "vllm:iteration_tokens_total"
    assert value(families, it, it + "_sum", model_name="b") == 10  # 7 prompt + 3 generated
    assert value(families, it, it + "_count", model_name="b") == 2  # two scheduler steps


def test_gauges_are_most_recent_not_summed(multiproc, families):
    assert any(p.name.startswith("gauge_mostrecent_") for p in multiproc.glob("*.db"))
    # Every writer ended with running=0; a summed or max gauge would still show 1 or 2.
    running = "vllm:num_requests_running"
    assert value(families, running, running, model_name="a") == 0


def test_token_buckets_follow_max_model_len(families):
    buckets = [
        s.labels["le"]
        for s in families["vllm:request_prompt_tokens"].samples
        if s.name.endswith("_bucket") and s.labels["model_name"] == "a"
    ]
    assert buckets == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "+Inf"]


def _vllm_definitions() -> dict[str, dict]:
    """name → keyword literals of every metric constructor call in vLLM's own loggers.py."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm is not installed")
    source = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    tree = ast.parse(source.read_text())
    # Bucket lists bound to a name first (``request_latency_buckets = [...]``).
    lists = {
        node.targets[0].id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.List)
    }
    found: dict[str, dict] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        name = kwargs.get("name")
        if not (isinstance(name, ast.Constant) and str(name.value).startswith("vllm:")):
            continue
        definition = {}
        for key in ("documentation", "multiprocess_mode", "buckets"):
            value = kwargs.get(key)
            if isinstance(value, ast.Name):
                value = lists.get(value.id)
            try:
                definition[key] = ast.literal_eval(value) if value is not None else None
            except ValueError:  # computed (build_1_2_5_buckets(max_model_len)): checked above
                continue
        found[str(name.value)] = {k: v for k, v in definition.items() if v is not None}
    return found


def test_help_buckets_and_modes_match_vllm_source(families):
    vllm = _vllm_definitions()
    assert "buckets" in vllm["vllm:e2e_request_latency_seconds"]  # the name was resolved
    for name in EXPECTED:
        definition = vllm[name]
        if "documentation" in definition:
            assert families[name].documentation == definition["documentation"], name
        if "buckets" in definition:
            les = sorted(
                {
                    float(s.labels["le"])
                    for s in families[name].samples
                    if s.name.endswith("_bucket")
                }
            )
            assert les == [float(b) for b in definition["buckets"]] + [float("inf")], name
    gauges = [n for n, t in EXPECTED.items() if t == "gauge"]
    assert {vllm[n]["multiprocess_mode"] for n in gauges} == {"mostrecent"}


def test_refuses_a_process_without_multiprocess_dir():
    env = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from serving.metrics.vllm_metrics import VllmMetrics; VllmMetrics('x')",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "MultiprocessModeError" in result.stderr
    assert "PROMETHEUS_MULTIPROC_DIR" in result.stderr
