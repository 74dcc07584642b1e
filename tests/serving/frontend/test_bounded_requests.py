"""Bounded requests on an instance's two HTTP surfaces, the OpenAI front end and the KServe v2
server, as real processes: bodies over the configured limit are 413 in each protocol's error
shape, answered before the body is read; prompts that cannot fit the context are refused before
they are tokenized; deep JSON and text that is not UTF-8 are 400s, never 500s."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from serving.kserve.errors import TritonError
from serving.kserve.http_infer import decompress, parse_infer
from serving.request_limits import MAX_JSON_DEPTH, json_depth
from serving.sampling.constraint_spec import ConstraintError, parse_constraint
from serving.sampling.params import parse_sampling_parameters
from serving.sampling.types import InvalidRequestError
from tests.serving.conftest import MODEL_NAME
from tests.serving.frontend_helpers import Engine, Frontend, frontend, kserve_engine

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

# Above the 10 MB prompt below (it must reach the prompt check), below the 16 MiB default.
LIMIT = 12_000_000
ENV = {"SERVING_MAX_BODY_BYTES": str(LIMIT)}
DEEP = "[" * 3000 + "]" * 3000


@pytest.fixture(scope="module")
def engine(frontend_repository: Path) -> Iterator[Engine]:
    with kserve_engine(frontend_repository, env=ENV) as running:
        yield running


@pytest.fixture(scope="module")
def front(frontend_repository: Path, engine: Engine) -> Iterator[Frontend]:
    with frontend(frontend_repository, engine.frontend_args, env=ENV) as running:
        yield running


def _read(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read()
    return response.status, dict(response.getheaders()), json.loads(body)


def declared_too_large(port: int, path: str, length: int) -> tuple[int, dict[str, str], Any]:
    """A request that announces ``length`` bytes and sends none of them: the answer must come
    from the header alone."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n"
        )
        sock.sendall(head.encode())
        return _read(sock)


def chunked_too_large(port: int, path: str, size: int) -> tuple[int, dict[str, str], Any]:
    """``size`` bytes in chunks, with no Content-Length for the server to go by."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        )
        sock.sendall(head.encode())
        chunk = 1 << 20
        sent = 0
        try:
            while sent < size:
                part = b"x" * min(chunk, size - sent)
                sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
                sent += len(part)
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and stopped reading, as it should
        return _read(sock)


def openai_error(answer: httpx.Response) -> dict[str, Any]:
    body = answer.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def kserve_error(answer: httpx.Response) -> str:
    body = answer.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str)
    return body["error"]


# -- body size ---------------------------------------------------------------------------------


def test_front_end_refuses_a_declared_oversized_body_from_its_header(front: Frontend) -> None:
    started = time.monotonic()
    status, headers, body = declared_too_large(front.port, "/v1/completions", 50_000_000)
    assert time.monotonic() - started < 5
    assert status == 413
    assert headers.get("connection") == "close"
    assert body["error"]["code"] == "request_too_large"
    assert str(LIMIT) in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"


def test_front_end_refuses_a_chunked_body_once_it_passes_the_limit(front: Frontend) -> None:
    status, _, body = chunked_too_large(front.port, "/v1/chat/completions", LIMIT + 1)
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert httpx.get(front.url + "/health/live").status_code == 200


def test_kserve_refuses_oversized_bodies_in_its_error_shape(engine: Engine) -> None:
    path = f"/v2/models/{MODEL_NAME}/generate"
    status, _, body = declared_too_large(engine.http_port, path, 50_000_000)
    assert status == 413 and set(body) == {"error"} and str(LIMIT) in body["error"]
    status, _, body = chunked_too_large(engine.http_port, path, LIMIT + 1)
    assert status == 413 and set(body) == {"error"}


def test_a_50_mb_body_is_answered_from_its_header_and_costs_no_memory(
    front: Frontend, engine: Engine
) -> None:
    size = 50_000_000
    for port, pid, path in (
        (front.port, front.process.pid, "/v1/completions"),
        (engine.http_port, engine.process.pid, f"/v2/models/{MODEL_NAME}/generate"),
    ):
        process = psutil.Process(pid)
        before = process.memory_info().rss
        sent = 0
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n\r\n"
            sock.sendall(head.encode())
            status, _, _ = _read(sock)
            assert status == 413
            # The server closed the connection: the rest of the body has nowhere to go.
            with contextlib.suppress(OSError):
                while sent < size:
                    sock.sendall(b"x" * (1 << 20))
                    sent += 1 << 20
        assert sent < size
        assert process.memory_info().rss - before < 8 * 1024 * 1024, path


def test_kserve_refuses_a_compressed_body_that_inflates_past_the_limit() -> None:
    bomb = gzip.compress(b" " * 2_000_000)
    with pytest.raises(TritonError) as refused:
        decompress(bomb, "gzip", 1_000_000)
    assert refused.value.http_status == 413
    assert decompress(bomb, "gzip", 2_000_000) == b" " * 2_000_000
    with pytest.raises(TritonError, match="truncated"):
        decompress(bomb[:-20], "gzip", 2_000_000)


# -- prompts that cannot fit the context --------------------------------------------------------


def test_a_10_mb_prompt_is_refused_before_it_is_tokenized(front: Frontend, engine: Engine) -> None:
    prompt = "word " * 2_000_000
    started = time.monotonic()
    answer = httpx.post(
        front.url + "/v1/completions",
        json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1},
        timeout=60,
    )
    assert answer.status_code == 400
    error = openai_error(answer)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "10000000 characters" in error["message"]

    answer = httpx.post(
        front.url + "/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}]},
        timeout=60,
    )
    assert answer.status_code == 400
    assert openai_error(answer)["param"] == "messages"

    # The engine holds the same line for callers that reach it directly.
    answer = httpx.post(
        f"http://127.0.0.1:{engine.http_port}/v2/models/{MODEL_NAME}/generate",
        json={"text_input": prompt, "max_tokens": 1},
        timeout=60,
    )
    assert answer.status_code == 400
    assert "10000000 characters" in kserve_error(answer)
    # Tokenizing 10 MB takes the demo tokenizer seconds; the refusals took a fraction of that.
    assert time.monotonic() - started < 5
    assert httpx.get(front.url + "/health/ready").status_code == 200


# -- JSON depth and text encoding ---------------------------------------------------------------


def test_deeply_nested_json_is_a_400_on_both_surfaces(front: Frontend, engine: Engine) -> None:
    body = f'{{"model": "{MODEL_NAME}", "prompt": "hi", "user": {DEEP}}}'
    answer = httpx.post(
        front.url + "/v1/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert "deeper than 64 levels" in openai_error(answer)["message"]

    kserve = f"http://127.0.0.1:{engine.http_port}"
    for path, content in (
        (f"/v2/models/{MODEL_NAME}/generate", '{"text_input": ' + DEEP + "}"),
        (f"/v2/models/{MODEL_NAME}/generate_stream", '{"parameters": {"a": ' + DEEP + "}}"),
        ("/v2/repository/index", DEEP),
        # JSON inside a string of the body: the tensor Triton's vLLM backend parses.
        (
            f"/v2/models/{MODEL_NAME}/generate",
            json.dumps({"text_input": "hi", "sampling_parameters": '{"a": ' + DEEP + "}"}),
        ),
    ):
        answer = httpx.post(kserve + path, content=content)
        assert answer.status_code == 400, path
        assert "deeper than 64 levels" in kserve_error(answer)


def test_infer_bodies_are_held_to_the_same_depth() -> None:
    with pytest.raises(TritonError, match="deeper than 64"):
        parse_infer(('{"inputs": ' + DEEP + "}").encode(), None)


def test_json_carried_in_strings_is_held_to_the_same_depth() -> None:
    with pytest.raises(InvalidRequestError, match=r"^sampling_parameters nests deeper than 64"):
        parse_sampling_parameters('{"a": ' + DEEP + "}")
    # Shallower than the limit is the parser's business, as before.
    assert parse_sampling_parameters('{"stop": ["a"], "seed": 1}').seed == 1
    nested = json.dumps({"structured_outputs": {"json": '{"a": ' + DEEP + "}"}})
    with pytest.raises(InvalidRequestError, match=r"^structured_outputs\.json nests deeper"):
        parse_sampling_parameters(nested)
    with pytest.raises(ConstraintError, match=r"^constraint nests deeper than 64"):
        parse_constraint(DEEP)


def test_text_that_is_not_utf8_is_a_400_on_both_surfaces(front: Frontend, engine: Engine) -> None:
    body = b'{"model": "%s", "prompt": "caf\xe9"}' % MODEL_NAME.encode()
    answer = httpx.post(
        front.url + "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400
    assert "not valid UTF-8" in openai_error(answer)["message"]

    # A lone surrogate is valid JSON (\ud800) but not text: named, not a 500.
    answer = httpx.post(
        front.url + "/v1/completions",
        content=f'{{"model": "{MODEL_NAME}", "prompt": "\\ud800", "max_tokens": 1}}',
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert "not valid UTF-8" in openai_error(answer)["message"]

    generate = f"http://127.0.0.1:{engine.http_port}/v2/models/{MODEL_NAME}/generate"
    answer = httpx.post(generate, content=b'{"text_input": "caf\xe9"}')
    assert answer.status_code == 400
    assert "not valid UTF-8" in kserve_error(answer)
    answer = httpx.post(generate, content='{"text_input": "\\ud800"}')
    assert answer.status_code == 400
    assert kserve_error(answer) == "input 'text_input' is not valid UTF-8 text"


def test_json_depth_counts_brackets_outside_strings_only() -> None:
    assert json_depth(b"{}") == 1
    assert json_depth(b'{"a": [1, {"b": []}]}') == 4
    assert json_depth(b'"[[[[[["') == 0
    assert json_depth(b'["a\\"[[[[", "\\\\", [[]]]') == 3
    assert json_depth(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) == MAX_JSON_DEPTH
    assert json_depth(b"") == 0


# -- internal errors ----------------------------------------------------------------------------


class _BrokenService:
    """Stands in for the inference service: every lookup fails the way a bug would."""

    def metadata(self, name: str, version: str) -> Any:
        raise RuntimeError("/srv/serving/kserve/service.py line 12: secret detail")


def test_kserve_internal_errors_answer_in_its_shape_without_the_detail(caplog) -> None:
    from starlette.testclient import TestClient

    from serving.kserve.http_server import build_app

    app = build_app(_BrokenService(), max_body_bytes=1000)  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get(f"/v2/models/{MODEL_NAME}")
        assert answer.status_code == 500
        assert answer.json() == {"error": "internal server error"}
        assert "secret" not in answer.text
        # The limit given to build_app, not the environment's.
        answer = client.post(f"/v2/models/{MODEL_NAME}/generate", content=b"{" * 1001)
        assert answer.status_code == 413 and "1000 bytes" in answer.json()["error"]


def test_front_end_internal_errors_answer_in_its_shape_without_the_detail() -> None:
    import asyncio

    from serving.frontend.errors import internal_error_handler

    answer = asyncio.run(internal_error_handler(None, RuntimeError("/srv/secret.py")))  # type: ignore[arg-type]
    assert answer.status_code == 500
    assert json.loads(answer.body) == {
        "error": {
            "message": "internal server error",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
