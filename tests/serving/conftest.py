"""Shared serving fixtures: a tiny random-weights model made locally, and a Triton model
repository pointing at it, laid out as an unpacked package is; and, for the end-to-end front-end
tests, the engine server and front end over a repository, with an ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from serving.demo_model import make_demo_model
from tests.serving.frontend_helpers import Engine, Frontend, frontend, kserve_engine

MODEL_NAME = "demo--tiny"


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("demo-model") / "weights")


def write_repository(
    root: Path,
    weights: Path,
    *,
    name: str = MODEL_NAME,
    report_custom_metrics: str | None = "true",
    parameters: dict[str, str] | None = None,
    **engine_args,
) -> Path:
    """``root/<name>/config.pbtxt`` + ``root/<name>/1/model.json``, as the portal packages a
    vLLM-backend version (``REPORT_CUSTOM_METRICS`` "true"; ``None`` leaves the parameter out;
    ``parameters``: more model configuration parameters)."""
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    values = dict(parameters or {})
    if report_custom_metrics is not None:
        values["REPORT_CUSTOM_METRICS"] = report_custom_metrics
    parameters_text = "".join(
        f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
        for key, value in values.items()
    )
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "vllm"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        "instance_group { count: 1 kind: KIND_MODEL }\n" + parameters_text
    )
    args = {"model": str(weights), "tokenizer": str(weights), "disable_log_stats": False}
    (model_dir / "1" / "model.json").write_text(json.dumps({**args, **engine_args}))
    return root


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory, demo_model_dir) -> Path:
    return write_repository(tmp_path_factory.mktemp("repository"), demo_model_dir, max_num_seqs=8)


# -- the end-to-end front-end tests: one engine and one front end per test module -------------


@pytest.fixture(scope="module")
def frontend_repository(model_repository: Path) -> Path:
    """The repository a module's engine and front end serve (a module may serve its own)."""
    return model_repository


@pytest.fixture(scope="module")
def engine(frontend_repository: Path) -> Iterator[Engine]:
    with kserve_engine(frontend_repository) as running:
        yield running


@pytest.fixture(scope="module")
def front(frontend_repository: Path, engine: Engine) -> Iterator[Frontend]:
    with frontend(frontend_repository, engine.frontend_args) as running:
        yield running


@pytest.fixture(scope="module")
def client(front: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_NAME, "temperature": 0.0, **fields}


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict)
    return body.get("error", body)  # the client unwraps {"error": ...} itself
