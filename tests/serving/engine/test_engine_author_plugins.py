"""Author plugins on the CPU engine: the example wheels (examples/plugins) installed into a
directory on the path, a tiny-bigram checkpoint (a custom architecture a general plugin
registers) served with the example NoRepeatWindow logits processor named in model.json, and
per-request windows through ``extra_args``."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.engine.core import Engine, load_engine
from serving.engine.logits_processors import load_general_plugins
from serving.engine.model import ModelLoadError
from serving.sampling.params import parse_sampling_parameters
from serving.sampling.types import GenerateRequest, InvalidRequestError
from tests.plugin_examples import installed_examples, make_bigram_checkpoint

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

PROCESSOR = "no_repeat_window:NoRepeatWindow"


@pytest.fixture(scope="module")
def plugin_path() -> Iterator[Path]:
    """The example wheels installed as the instance installs them, first on ``sys.path``."""
    target = installed_examples()
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def bigram_dir(plugin_path: Path, demo_model_dir: Path, tmp_path_factory) -> Path:
    return make_bigram_checkpoint(
        tmp_path_factory.mktemp("tiny-bigram") / "weights", demo_model_dir
    )


def write_model_json(root: Path, weights: Path, **args) -> Path:
    version = root / "1"
    version.mkdir(parents=True)
    base = {"model": str(weights), "tokenizer": str(weights), "max_model_len": 128}
    (version / "model.json").write_text(json.dumps({**base, **args}))
    return version


@pytest.fixture(scope="module")
def engine(bigram_dir: Path, tmp_path_factory) -> Iterator[Engine]:
    from serving.constraints import LOGITS_PROCESSOR

    version = write_model_json(
        tmp_path_factory.mktemp("repository"),
        bigram_dir,
        max_num_seqs=4,
        # As the instance writes it: the platform's processor first, then the author's.
        logits_processors=[LOGITS_PROCESSOR, PROCESSOR],
    )
    engine = load_engine(version, name="tiny-bigram")
    yield engine
    engine.shutdown()


async def generate(engine: Engine, rid: str, window: int | None, max_tokens: int = 24):
    params: dict = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if window is not None:
        params["extra_args"] = {"no_repeat_window": window}
    request = GenerateRequest(rid, "Hello world", parse_sampling_parameters(params))
    tokens: list[int] = []
    async for delta in engine.generate(request):
        tokens.extend(delta.token_ids)
    return tokens


def repeats_within(tokens: list[int], window: int) -> bool:
    return any(t in tokens[max(0, i - window) : i] for i, t in enumerate(tokens))


def test_the_general_plugin_registers_the_architecture_from_its_entry_point(
    plugin_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("VLLM_PLUGINS", "tiny_bigram")
    assert load_general_plugins() == ["tiny_bigram"]
    monkeypatch.setenv("VLLM_PLUGINS", "someone_else")
    assert load_general_plugins() == []  # only the named plugins, as vLLM


def test_the_custom_architecture_loads_and_the_window_holds(engine: Engine) -> None:
    assert type(engine.model).__name__ == "TinyBigramForCausalLM"
    assert engine.processors is not None
    assert [type(p).__name__ for p in engine.processors.processors] == ["NoRepeatWindow"]
    plain = asyncio.run(generate(engine, "plain", None))
    assert len(plain) == 24 and repeats_within(plain, 1)  # the bigram's greedy loop
    for window in (2, 5):
        out = asyncio.run(generate(engine, f"w{window}", window))
        assert len(out) == 24
        assert not repeats_within(out, window), (window, out)
    assert asyncio.run(generate(engine, "zero", 0)) == plain  # 0: off


def test_concurrent_requests_with_different_windows_share_one_batch(engine: Engine) -> None:
    async def together():
        windows = [None, 3, 7, 1, 4, 2]  # more than max_num_seqs: rows are freed and reused
        lengths = [9, 24, 17, 5, 24, 12]
        return windows, await asyncio.gather(
            *(
                generate(engine, f"c{i}", w, n)
                for i, (w, n) in enumerate(zip(windows, lengths, strict=True))
            )
        )

    alone = {w: asyncio.run(generate(engine, f"a{w}", w)) for w in (3, 7, 4)}
    windows, outputs = asyncio.run(together())
    for window, out in zip(windows, outputs, strict=True):
        if window:
            assert not repeats_within(out, window), (window, out)
            if window in alone:  # batched with others, the same greedy output as alone
                assert out == alone[window][: len(out)]
        else:
            assert repeats_within(out, 1)


def test_a_bad_window_is_refused_when_admitted(engine: Engine) -> None:
    with pytest.raises(InvalidRequestError, match="no_repeat_window must be a non-negative"):
        asyncio.run(generate(engine, "bad", -1))


def test_an_unloadable_processor_fails_the_load(bigram_dir: Path, tmp_path) -> None:
    for name, message in (
        ("no_such_module:Thing", "does not load"),
        ("tiny_bigram:register", "not a vLLM V1 LogitsProcessor"),
    ):
        version = write_model_json(tmp_path / name.replace(":", "-"), bigram_dir)
        model_json = version / "model.json"
        args = json.loads(model_json.read_text())
        model_json.write_text(json.dumps({**args, "logits_processors": [name]}))
        with pytest.raises(ModelLoadError, match=message):
            load_engine(version, name="bad")
