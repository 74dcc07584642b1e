"""The ``vllm:`` families Triton's vLLM backend bridges onto Triton's metrics port, served by the
CPU engine: names, help texts, types, labels and buckets as the backend registers them, values
that equal what known requests did, the backend's enabling rule, and the unified ``/metrics``
keeping the multiprocess family where both exist.

One real ``python -m serving.kserve`` process serves four copies of the demo model that differ
only in how metrics are configured, so the enabling rule is checked on one metrics port."""

from __future__ import annotations

import json
import queue
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc

from serving.engine.stats import FinishedRequest
from serving.kserve.server import reports_custom_metrics
from serving.metrics import triton_vllm
from serving.metrics.triton_vllm import TritonVllmMetrics
from serving.metrics.unified import check_exposition, merge, read_multiprocess, split_families
from tests.serving.conftest import write_repository
from tests.serving.kserve_helpers import (
    KServeProcess,
    count_of,
    generate_inputs,
    is_final,
    start_kserve,
)

# Triton's vLLM backend, src/utils/metrics.py (TritonMetrics) at commit
# 8de0c148bda1da25de1e05ffaaf67116dacc7264: (name, type, help, buckets or None). The token-count
# buckets are vLLM's 1-2-5 series up to max_model_len.
TOKEN_COUNT = "1-2-5 up to max_model_len"
BACKEND_FAMILIES: dict[str, tuple[str, str, tuple[float, ...] | str | None]] = {
    "vllm:prompt_tokens_total": ("counter", "Number of prefill tokens processed.", None),
    "vllm:generation_tokens_total": ("counter", "Number of generation tokens processed.", None),
    "vllm:time_to_first_token_seconds": (
        "histogram",
        "Histogram of time to first token in seconds.",
        (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10),
    ),
    "vllm:time_per_output_token_seconds": (
        "histogram",
        "Histogram of time per output token in seconds.",
        (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    ),
    "vllm:e2e_request_latency_seconds": (
        "histogram",
        "Histogram of end to end request latency in seconds.",
        (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    ),
    "vllm:request_prompt_tokens": ("histogram", "Number of prefill tokens processed.", TOKEN_COUNT),
    "vllm:request_generation_tokens": (
        "histogram",
        "Number of generation tokens processed.",
        TOKEN_COUNT,
    ),
    "vllm:request_params_n": (
        "histogram",
        "Histogram of the n request parameter.",
        (1, 2, 5, 10, 20),
    ),
}

MAX_MODEL_LEN = 256
ON, ABSENT, FALSE, STATS_OFF = "metrics-on", "metrics-absent", "metrics-false", "metrics-stats-off"
PROMPTS = ["The most dangerous animal is", "The capital of France is", "The future of AI is"]
MAX_TOKENS = 5
ROUNDS = 2  # as Triton's test: two streams of the three prompts
SAMPLING = {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True}


# --- without a server -------------------------------------------------------------------------


def parse(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_families_are_the_backends_with_vllms_own_token_buckets() -> None:
    from vllm.v1.metrics.loggers import build_1_2_5_buckets

    metrics = TritonVllmMetrics("m", "3", MAX_MODEL_LEN)
    text = triton_vllm.render([metrics])
    check_exposition(text)
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.MULTILINE))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    assert list(helps) == list(BACKEND_FAMILIES)
    for name, (kind, help_text, buckets) in BACKEND_FAMILIES.items():
        assert types[name] == kind and helps[name] == help_text
        samples = [line for line in text.splitlines() if line.startswith(name)]
        assert all('{model="m",version="3"' in line for line in samples), samples
        if kind == "counter":
            assert samples == [f'{name}{{model="m",version="3"}} 0']  # present from the start
            continue
        expected = build_1_2_5_buckets(MAX_MODEL_LEN) if buckets == TOKEN_COUNT else buckets
        les = re.findall(rf'^{re.escape(name)}_bucket{{.*le="([^"]+)"}} 0$', text, re.MULTILINE)
        assert [float(le) for le in les] == [*map(float, expected), float("inf")]  # type: ignore[arg-type]


def test_observations_land_in_upper_inclusive_cumulative_buckets() -> None:
    metrics = TritonVllmMetrics("m", "1", 100)
    metrics.on_prefill(7, 7, 0)
    metrics.on_first_token(0.02)
    metrics.on_tokens(2, [0.01, 3.0])
    request = FinishedRequest("length", 7, 3, 3, 1, 0.0, 0.0, 0.0, 0.0, 2.5)
    metrics.on_finished(request)
    families = parse(triton_vllm.render([metrics]))

    def sample(family: str, name: str, **labels: str) -> float:
        for s in families[family].samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise KeyError(name, labels)

    assert sample("vllm:prompt_tokens", "vllm:prompt_tokens_total") == 7
    assert sample("vllm:generation_tokens", "vllm:generation_tokens_total") == 2
    tpot = "vllm:time_per_output_token_seconds"
    assert sample(tpot, f"{tpot}_bucket", le="0.01") == 1  # le is inclusive
    assert sample(tpot, f"{tpot}_bucket", le="2.5") == 1
    assert sample(tpot, f"{tpot}_bucket", le="+Inf") == 2
    assert sample(tpot, f"{tpot}_sum") == pytest.approx(3.01)
    e2e = "vllm:e2e_request_latency_seconds"
    assert sample(e2e, f"{e2e}_bucket", le="1") == 0
    assert sample(e2e, f"{e2e}_bucket", le="2.5") == 1
    tokens = "vllm:request_prompt_tokens"
    assert sample(tokens, f"{tokens}_bucket", le="5") == 0
    assert sample(tokens, f"{tokens}_bucket", le="10") == 1
    assert sample(tokens, f"{tokens}_sum") == 7


def test_n_is_observed_once_per_request_with_its_last_completion() -> None:
    metrics = TritonVllmMetrics("m", "1", 100)
    for last in (False, False, True):  # three completions of one n=3 request
        metrics.on_finished(
            FinishedRequest("length", 7, 3, 3, 3, 0.0, 0.0, 0.0, 0.0, 0.5, last_of_parent=last)
        )
    families = parse(triton_vllm.render([metrics]))
    samples = {
        s.name: s.value for s in families["vllm:request_params_n"].samples if not s.labels.get("le")
    }
    assert samples["vllm:request_params_n_count"] == 1 and samples["vllm:request_params_n_sum"] == 3
    e2e = {s.name: s.value for s in families["vllm:e2e_request_latency_seconds"].samples}
    assert e2e["vllm:e2e_request_latency_seconds_count"] == 3  # each completion is a request


def test_no_models_reporting_renders_nothing() -> None:
    assert triton_vllm.render([]) == ""


@pytest.mark.parametrize(
    "value, enabled",
    [("true", True), ("TRUE", True), ("True", True), ("false", False), ("yes", False), ("", False)],
)
def test_report_custom_metrics_is_read_as_the_backend_reads_it(value: str, enabled: bool) -> None:
    config = mc.ModelConfig(name="m", backend="vllm")
    assert not reports_custom_metrics(config)
    config.parameters["REPORT_CUSTOM_METRICS"].string_value = value
    assert reports_custom_metrics(config) is enabled


# --- one real engine process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def kserve(demo_model_dir, tmp_path_factory) -> Any:
    root = tmp_path_factory.mktemp("repository")
    write_repository(root, demo_model_dir, name=ON, max_model_len=MAX_MODEL_LEN)
    write_repository(root, demo_model_dir, name=ABSENT, report_custom_metrics=None)
    write_repository(root, demo_model_dir, name=FALSE, report_custom_metrics="false")
    write_repository(root, demo_model_dir, name=STATS_OFF, disable_log_stats=True)
    server = start_kserve(root, tmp_path_factory.mktemp("kserve"))
    yield server
    assert server.stop() == 0


def engine_text(kserve: KServeProcess) -> str:
    response = httpx.get(f"http://127.0.0.1:{kserve.metrics}/metrics", timeout=10)
    response.raise_for_status()
    return response.text


def peer_parse(text: str) -> dict[str, float]:
    """What Triton's metrics test reads: every ``vllm:`` sample line by sample name, the last
    line of a name winning (so ``..._bucket`` is the ``+Inf`` bucket of the last series)."""
    found = re.findall(r"^(vllm:[^ {]+)(?:{.*})? ([0-9.-]+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def run_rounds(kserve: KServeProcess, model: str) -> list[int]:
    """Triton's test's traffic: per round, one stream with the three prompts in flight at once.
    Returns each request's prompt length, as the engine reported it."""
    prompt_lengths = []
    client = grpcclient.InferenceServerClient(kserve.grpc_url)
    try:
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        for _ in range(ROUNDS):
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            for i, prompt in enumerate(PROMPTS):
                inputs = generate_inputs(prompt, SAMPLING)
                client.async_stream_infer(model, inputs, request_id=str(i))
            finals: dict[str, Any] = {}
            while len(finals) < len(PROMPTS):
                result, error = results.get(timeout=120)
                assert error is None, error
                request_id = result.get_response().id
                if is_final(result):
                    finals[request_id] = result
            client.stop_stream()
            for result in finals.values():
                assert count_of(result, "num_output_tokens") == MAX_TOKENS
                prompt_lengths.append(count_of(result, "num_input_tokens"))
    finally:
        client.close()
    return prompt_lengths


@pytest.fixture(scope="module")
def served(kserve) -> dict[str, Any]:
    """Metrics before and after the known traffic on every model (fixture order is the run)."""
    before = engine_text(kserve)
    lengths = {model: run_rounds(kserve, model) for model in (ON, ABSENT, FALSE, STATS_OFF)}
    return {"before": before, "after": engine_text(kserve), "lengths": lengths}


def test_families_exist_at_zero_before_any_request(served) -> None:
    values = peer_parse(served["before"])
    assert set(values) == {
        *(n for n, (kind, _, _) in BACKEND_FAMILIES.items() if kind == "counter"),
        *(
            f"{n}{suffix}"
            for n, (kind, _, _) in BACKEND_FAMILIES.items()
            if kind == "histogram"
            for suffix in ("_count", "_sum", "_bucket")
        ),
    }
    assert set(values.values()) == {0.0}


def test_counts_and_sums_equal_what_the_requests_did(served) -> None:
    text = served["after"]
    check_exposition(text)
    # Only the model whose config.pbtxt says "true" and whose model.json keeps stats on.
    labels = set(re.findall(r'^vllm:[^{]+\{model="([^"]+)",version="1"', text, re.MULTILINE))
    assert labels == {ON}
    values = peer_parse(text)
    requests = ROUNDS * len(PROMPTS)
    prompt_tokens = sum(served["lengths"][ON])
    assert values["vllm:prompt_tokens_total"] == prompt_tokens
    assert values["vllm:generation_tokens_total"] == requests * MAX_TOKENS
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert values[f"{name}_count"] == values[f"{name}_bucket"] == requests
        assert values[f"{name}_sum"] > 0
    tpot = "vllm:time_per_output_token_seconds"  # every token after a request's first
    assert values[f"{tpot}_count"] == values[f"{tpot}_bucket"] == requests * (MAX_TOKENS - 1)
    assert values[f"{tpot}_sum"] > 0
    tokens = "vllm:request_prompt_tokens"
    assert values[f"{tokens}_count"] == values[f"{tokens}_bucket"] == requests
    assert values[f"{tokens}_sum"] == prompt_tokens
    tokens = "vllm:request_generation_tokens"
    assert values[f"{tokens}_count"] == values[f"{tokens}_bucket"] == requests
    assert values[f"{tokens}_sum"] == requests * MAX_TOKENS
    n = "vllm:request_params_n"
    assert values[f"{n}_count"] == values[f"{n}_bucket"] == requests
    assert values[f"{n}_sum"] == requests
    # The token buckets follow the model's max_model_len as the backend's do.
    les = re.findall(r'^vllm:request_prompt_tokens_bucket{.*le="([^"]+)"}', text, re.MULTILINE)
    assert les == ["1", "2", "5", "10", "20", "50", "100", "200", "+Inf"]


def test_the_multiprocess_files_saw_the_same_events(served, kserve) -> None:
    vllm = read_multiprocess(kserve.multiproc_dir)
    assert vllm is not None
    families = parse(vllm.text)

    def total(family: str, sample: str) -> float:
        return sum(
            s.value
            for s in families[family].samples
            if s.name == sample and s.labels.get("model_name") == ON
        )

    bridged = peer_parse(served["after"])
    assert (
        total("vllm:prompt_tokens", "vllm:prompt_tokens_total")
        == bridged["vllm:prompt_tokens_total"]
    )
    assert (
        total("vllm:generation_tokens", "vllm:generation_tokens_total")
        == bridged["vllm:generation_tokens_total"]
    )
    assert (
        total("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count")
        == bridged["vllm:time_per_output_token_seconds_count"]
    )


def test_unified_metrics_keep_the_multiprocess_family_and_drop_the_bridged_copy(
    served, kserve
) -> None:
    vllm = read_multiprocess(kserve.multiproc_dir)
    text = merge(served["after"], vllm)
    check_exposition(text)
    families = split_families(text)
    names = [family.name for family in families]
    assert len(names) == len(set(names))
    parsed = parse(text)
    for name in BACKEND_FAMILIES:
        family = parsed[name.removesuffix("_total")]
        label_sets = {tuple(sorted(s.labels)) for s in family.samples}
        if name == "vllm:time_per_output_token_seconds":  # no multiprocess twin: bridged stays
            assert label_sets == {("model", "version"), ("le", "model", "version")}
        else:  # the multiprocess family, with vLLM's labels
            assert all("model_name" in labels for labels in label_sets), (name, label_sets)
    # The bridged prompt counter's sample name is also the multiprocess counter's: one family.
    assert text.count("# TYPE vllm:prompt_tokens_total ") == 1
    assert 'vllm:prompt_tokens_total{model="' not in text
    assert "nv_inference_count" in parsed


def test_disabled_models_report_no_vllm_family(served, kserve) -> None:
    # The traffic reached all four models; only ON has vllm: samples (checked above), and the
    # nv_* families count the others' requests, so they were served.
    families = parse(served["after"])
    success = {
        s.labels["model"]: s.value
        for s in families["nv_inference_request_success"].samples
        if s.name == "nv_inference_request_success_total"
    }
    assert {model: success[model] for model in (ABSENT, FALSE, STATS_OFF)} == dict.fromkeys(
        (ABSENT, FALSE, STATS_OFF), ROUNDS * len(PROMPTS)
    )
    assert not any(
        f'model="{model}"' in line
        for line in served["after"].splitlines()
        if line.startswith("vllm:")
        for model in (ABSENT, FALSE, STATS_OFF)
    )


def test_disable_log_stats_must_be_a_bool(tmp_path: Path, demo_model_dir) -> None:
    from serving.engine.model import ModelLoadError, read_engine_config

    write_repository(tmp_path, demo_model_dir, name="m", disable_log_stats="false")
    with pytest.raises(ModelLoadError, match="disable_log_stats must be true or false"):
        read_engine_config(tmp_path / "m" / "1")
    model_json = json.loads((tmp_path / "m" / "1" / "model.json").read_text())
    assert model_json["disable_log_stats"] == "false"  # nothing was rewritten
