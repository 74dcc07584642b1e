"""Run Triton's OpenAI front-end tests (``python/openai/tests`` of
triton-inference-server/server at e1db8a6, see README.md) against ``python -m serving.frontend``.

Triton's own ``conftest.py`` finds a backend (vLLM or TensorRT-LLM) and a Llama-3.1-8B-Instruct
repository, then starts its front end per module (the ``server`` fixture, for the ``openai``
client tests) and its FastAPI app in-process per class (``fastapi_client_class_scope``, for the
raw HTTP tests). This file provides the same fixtures by name, over one pair of real processes
for the whole peer run: the CPU engine (``python -m serving.kserve``, standing in for
``tritonserver`` with the vLLM backend) serving the random-weights demo model, and the front end
in front of it. The test files change only where they import Triton's ``tests.utils`` and
``tritonserver``; README.md lists each change, and each test listed below with its reason.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from serving.demo_model import make_demo_model
from tests.serving.conftest import write_repository
from tests.serving.frontend_helpers import frontend, kserve_engine

from .utils import FrontendServer

# The repository's model name. Triton's tests read it from the ``model`` fixture only.
MODEL = "demo--tiny"


def pytest_configure(config: pytest.Config) -> None:
    """The markers Triton's conftest registers (the suite runs with ``--strict-markers``)."""
    config.addinivalue_line("markers", "openai: mark test to run with OpenAI server (subprocess)")
    config.addinivalue_line("markers", "asyncio: mark test as an asyncio test")


# --- the asyncio tests ---------------------------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run the ``@pytest.mark.asyncio`` tests, as pytest-asyncio does for Triton's CI (it is not
    a dependency here). One event loop serves them all: the class-scoped ``AsyncOpenAI`` client
    keeps its connections from one test to the next, and they belong to the loop that made them."""
    global _loop
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    if _loop is None:
        _loop = asyncio.new_event_loop()
    names = pyfuncitem._fixtureinfo.argnames
    _loop.run_until_complete(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


def pytest_unconfigure(config: pytest.Config) -> None:
    if _loop is not None:
        _loop.close()


# --- Triton's fixtures, by name ------------------------------------------------------------------


@pytest.fixture(scope="session")
def tool_call_parser() -> str:
    return "llama3"


@pytest.fixture(scope="session")
def backend() -> str:
    """The CPU engine serves the repository as Triton's vLLM backend does."""
    return "vllm"


@pytest.fixture(scope="session")
def model() -> str:
    return MODEL


@pytest.fixture(scope="session")
def tokenizer_model(model_weights: Path) -> str:
    """The demo model's own tokenizer (the repository's ``model.json`` names it)."""
    return str(model_weights)


@pytest.fixture(scope="session")
def prompt() -> str:
    return "What is machine learning?"


@pytest.fixture(scope="session")
def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="session")
def input(prompt: str) -> str:
    return prompt


@pytest.fixture(scope="session")
def model_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with 2048 positions (default 1024): the tool-calling requests render two
    tool schemas into the prompt (1133 tokens with main's demo chat template) and ask for up to
    128 more. The weights are the default seed's (positions are rotary, not learned)."""
    out = tmp_path_factory.mktemp("openai-peer-demo") / "weights"
    return make_demo_model(out, max_position_embeddings=2048)


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory, model_weights: Path) -> str:
    root = tmp_path_factory.mktemp("openai-peer-repository")
    return str(write_repository(root, model_weights, name=MODEL, max_num_seqs=8))


@pytest.fixture(scope="session")
def server(model_repository: str) -> Iterator[FrontendServer]:
    """The engine and the front end, started once for every peer module (Triton starts its
    front end once per module)."""
    repository = Path(model_repository)
    with kserve_engine(repository) as engine, frontend(repository, engine.frontend_args) as front:
        yield FrontendServer(front.url)


@pytest.fixture(scope="class")
def fastapi_client_class_scope(server: FrontendServer) -> Iterator[httpx.Client]:
    """Triton's ``TestClient`` over its in-process app becomes an HTTP client of the running
    front end: the same ``post``/``stream`` calls, the same ``Response`` objects (both httpx)."""
    with httpx.Client(base_url=server.url_root, timeout=120) as client:
        yield client


# --- what is expected to fail here, and why ------------------------------------------------------
#
# Keys are node ids relative to this directory. Each xfail is strict (an unexpected pass fails
# the run, so a stale entry is noticed) and names the exception the divergence raises, so a
# different failure (a crash, a 500) is still reported as a failure.

_ERROR_BODY = (
    "error body is OpenAI's {'error': {message, type, param, code}} (what the openai client and "
    "vLLM's server use), not FastAPI's {'detail': ...} that Triton's front end answers with; the "
    "status and message match (docs/openai_api.md, 'Errors')"
)
_STATUS_400 = (
    "an invalid request is answered 400 with OpenAI's error body, as OpenAI and vLLM answer it; "
    "Triton's front end leaves FastAPI's 422 (docs/openai_api.md, 'Errors')"
)
_LOGIT_BIAS = (
    "logit_bias is served (token id -> bias, as OpenAI and vLLM apply it); Triton's front end "
    "refuses it with 400 'logit bias is not currently supported', which the test expects"
)

# Where this front end answers differently from Triton's on purpose.
DIVERGES_ON_PURPOSE: dict[str, tuple[str, type[BaseException]]] = {
    # logit_bias is served; Triton's front end refuses it (the test expects its 400).
    "test_chat_completions.py::TestChatCompletions::"
    "test_chat_completions_sampling_parameters[logit_bias-param_value11]": (
        _LOGIT_BIAS,
        AssertionError,
    ),
    "test_completions.py::TestCompletions::"
    "test_completions_sampling_parameters[logit_bias-value7]": (_LOGIT_BIAS, AssertionError),
    # top_logprobs without logprobs: 400 with Triton's own message (test_openai_client.py's
    # test_top_logprobs_requires_logprobs checks the message and passes); only the body differs.
    "test_chat_completions.py::TestChatCompletions::"
    "test_chat_completions_top_logprobs_without_logprobs[0]": (_ERROR_BODY, KeyError),
    "test_chat_completions.py::TestChatCompletions::"
    "test_chat_completions_top_logprobs_without_logprobs[5]": (_ERROR_BODY, KeyError),
    # n > 1 is served (choices with seeds seed + i); Triton's front end refuses it.
    "test_chat_completions.py::TestChatCompletions::test_chat_completions_multiple_choices": (
        "n > 1 is served (n engine requests, choice i seeded seed + i); Triton refuses it with "
        "'only single choice'",
        AssertionError,
    ),
    "test_completions.py::TestCompletions::"
    "test_completions_multiple_choices[sampling_parameter_dict0]": (
        "n > 1 is served; Triton refuses n=2 with 'only single choice'",
        AssertionError,
    ),
    "test_completions.py::TestCompletions::"
    "test_completions_multiple_choices[sampling_parameter_dict1]": (
        "best_of=2 is refused with 400 as Triton does ('best_of is not supported by this platform "
        "(vLLM V1 removed it)'); " + _ERROR_BODY,
        KeyError,
    ),
    "test_completions.py::TestCompletions::"
    "test_completions_multiple_choices[sampling_parameter_dict2]": (
        "n=2 with best_of=2 is refused with 400 as Triton does (for best_of); " + _ERROR_BODY,
        KeyError,
    ),
    "test_completions.py::TestCompletions::"
    "test_completions_multiple_choices[sampling_parameter_dict3]": (
        "n=2 with best_of=1 is refused with 400 ('best_of must be at least n', as OpenAI defines "
        "best_of) where Triton says 'only single choice'; " + _ERROR_BODY,
        KeyError,
    ),
    # logprobs=0 on completions.
    "test_completions.py::TestCompletions::test_completions_logprobs_zero": (
        "completions logprobs=0 returns the sampled token's logprob with no alternatives, as "
        "OpenAI and vLLM define it; Triton's front end returns no logprobs for 0",
        AssertionError,
    ),
    # Schema validation: 400, not 422.
    "test_chat_completions.py::TestChatCompletions::test_chat_completions_no_message": (
        _STATUS_400,
        AssertionError,
    ),
    "test_chat_completions.py::TestChatCompletions::test_chat_completions_empty_message": (
        _STATUS_400,
        AssertionError,
    ),
    "test_chat_completions.py::TestChatCompletions::test_chat_completions_top_logprobs_validation": (
        _STATUS_400,
        AssertionError,
    ),
    "test_completions.py::TestCompletions::test_completions_empty_request": (
        _STATUS_400,
        AssertionError,
    ),
    "test_completions.py::TestCompletions::test_completions_no_model": (
        _STATUS_400,
        AssertionError,
    ),
    "test_completions.py::TestCompletions::test_completions_no_prompt": (
        _STATUS_400,
        AssertionError,
    ),
    "test_completions.py::TestCompletions::test_no_prompt": (_STATUS_400, AssertionError),
    "test_completions.py::TestCompletions::test_completions_logprobs_validation": (
        _STATUS_400,
        AssertionError,
    ),
    "test_openai_client.py::TestAsyncOpenAIClient::test_chat_top_logprobs_exceeds_max": (
        _STATUS_400 + " (the openai client raises BadRequestError, not UnprocessableEntityError)",
        openai.BadRequestError,
    ),
    "test_openai_client.py::TestAsyncOpenAIClient::test_completion_logprobs_exceeds_max": (
        _STATUS_400 + " (the openai client raises BadRequestError, not UnprocessableEntityError)",
        openai.BadRequestError,
    ),
}
for _param, _value in [
    ("temperature", "2.1"),
    ("temperature", "-0.1"),
    ("max_tokens", "-1"),
    ("max_completion_tokens", "-1"),
    ("top_p", "1.1"),
    ("frequency_penalty", "3"),
    ("frequency_penalty", "-3"),
    ("presence_penalty", "2.1"),
    ("presence_penalty", "-2.1"),
    ("min_tokens", "-1"),
    ("ignore_eos", "123"),
]:
    DIVERGES_ON_PURPOSE[
        "test_chat_completions.py::TestChatCompletions::"
        f"test_chat_completions_invalid_sampling_parameters[{_param}-{_value}]"
    ] = (_STATUS_400, AssertionError)
    if _param != "max_completion_tokens":  # chat only
        DIVERGES_ON_PURPOSE[
            "test_completions.py::TestCompletions::"
            f"test_completions_invalid_sampling_parameters[{_param}-{_value}]"
        ] = (_STATUS_400, AssertionError)

# What Llama-3.1-8B-Instruct does and the random-weights demo model cannot: these fail for the
# model, whatever the front end does.
_NAMED_TOOL = (
    "model-dependent: a forced call's arguments must say city 'Dallas', state 'TX' and unit "
    "'fahrenheit' (read from the question); the demo model's constrained arguments are random "
    "strings."
)
MODEL_DEPENDENT: dict[str, str] = {
    "test_tool_calling.py::TestAsyncClientToolCalling::test_tool_call_and_choice": (
        "model-dependent: with tool_choice auto the model must decide to call get_current_weather "
        "with Dallas/TX/fahrenheit; the demo model writes noise, never a tool call"
    ),
    "test_tool_calling.py::TestAsyncClientToolCalling::test_tool_call_with_named_tool_choice": (
        _NAMED_TOOL
    ),
    "test_tool_calling.py::TestAsyncClientToolCalling::test_tool_call_with_required_tool_choice": (
        _NAMED_TOOL.replace("a forced call's", "a required call's")
    ),
}

# Not deterministic with the demo model (sampled at temperature 1 over a near-uniform
# 512-token distribution), so neither a pass nor an xfail would be stable. Probabilities are the
# demo model's own (seed 0) for these prompts.
NOT_DETERMINISTIC: dict[str, str] = {
    "test_chat_completions.py::TestChatCompletions::test_chat_completions_max_tokens[max_tokens]": (
        "model-dependent and random: a 1-token answer must be exactly one word, but 3.5% of the "
        "demo model's first tokens are whitespace, special or </s> (4 requests: ~13% of runs "
        "fail); Llama's first token is a word"
    ),
    "test_chat_completions.py::TestChatCompletions::"
    "test_chat_completions_max_tokens[max_completion_tokens]": (
        "model-dependent and random: a 1-token answer must be exactly one word, but 3.5% of the "
        "demo model's first tokens are whitespace, special or </s> (4 requests: ~13% of runs fail)"
    ),
    "test_completions.py::TestCompletions::test_completions_max_tokens": (
        "model-dependent and random: a 1-token answer must be exactly one word, but 3.1% of the "
        "demo model's first tokens are whitespace, special or </s> (2 requests: ~6% of runs fail)"
    ),
}
for _cls in ("TestOpenAIClient", "TestAsyncOpenAIClient"):
    for _test in ("test_openai_client_completion", "test_openai_client_chat_completion"):
        NOT_DETERMINISTIC[f"test_openai_client.py::{_cls}::{_test}"] = (
            "model-dependent and random: expects finish_reason 'stop' within the default 16 "
            "tokens (Llama answers and ends); the demo model emits </s> with p~0.002 per token, "
            "so 'length' ~97% of the time and 'stop' otherwise"
        )

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = {**DIVERGES_ON_PURPOSE, **MODEL_DEPENDENT, **NOT_DETERMINISTIC}
    seen: set[str] = set()
    for item in items:
        if item.path.parent != HERE:
            continue
        # Without the xdist group's "@peers-openai", which --dist loadgroup appends to an id.
        key = item.nodeid.split("openai_frontend/", 1)[-1].split("@", 1)[0]
        if key in DIVERGES_ON_PURPOSE:
            reason, raises = DIVERGES_ON_PURPOSE[key]
            item.add_marker(pytest.mark.xfail(reason=reason, raises=raises, strict=True))
        elif key in MODEL_DEPENDENT:
            item.add_marker(pytest.mark.xfail(reason=MODEL_DEPENDENT[key], strict=True))
        elif key in NOT_DETERMINISTIC:
            item.add_marker(pytest.mark.skip(reason=NOT_DETERMINISTIC[key]))
        if key in listed:
            seen.add(key)
    # A whole-directory run must find every listed test (a renamed test or parameter would
    # otherwise leave its entry silently unused).
    whole = not config.option.keyword and not config.option.markexpr
    whole = whole and not any("::" in str(arg) for arg in config.args)
    collected_files = {item.path.name for item in items if item.path.parent == HERE}
    stale = [key for key in listed if key.split("::", 1)[0] in collected_files and key not in seen]
    if whole and stale:
        raise pytest.UsageError(
            "conftest.py lists tests that were not collected: " + ", ".join(stale)
        )
