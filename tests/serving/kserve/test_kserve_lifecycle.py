"""Start-up and shutdown of ``python -m serving.kserve``: ports stay closed until the engine is
ready, a model that cannot load stops the start, and SIGTERM drains in-flight requests."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import socket
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from tests.ports import free_port
from tests.serving.conftest import MODEL_NAME, write_repository
from tests.serving.kserve_helpers import (
    READY,
    KServeProcess,
    count_of,
    generate_inputs,
    is_final,
    launch,
    text_of,
)

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_ports_open_only_when_ready_and_sigterm_drains_streams(model_repository, tmp_path) -> None:
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    proc = launch(
        model_repository,
        tmp_path,
        "--http-port",
        str(ports["http"]),
        "--grpc-port",
        str(ports["grpc"]),
        "--metrics-port",
        str(ports["metrics"]),
        # Four 600-token streams must finish inside the drain: 30 s (the default) was too short
        # with both cores taken by other work (./dev test --under-load).
        "--exit-timeout-secs",
        "300",
    )
    # Python has not even imported torch yet, let alone loaded the weights.
    assert all(_refused(port) for port in ports.values())
    assert proc.stdout is not None
    match = READY.search(proc.stdout.readline())
    assert match, (tmp_path / "kserve.log").read_text()
    http, grpc, metrics = map(int, match.groups())
    server = KServeProcess(proc, http, grpc, metrics, tmp_path / "kserve.log")
    assert (server.http, server.grpc, server.metrics) == (
        ports["http"],
        ports["grpc"],
        ports["metrics"],
    )
    health = f"http://{server.http_url}/v2/health/ready"
    assert httpx.get(health).status_code == 200

    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    sampling = {"temperature": 0, "max_tokens": 600, "ignore_eos": True}
    for i in range(4):
        inputs = generate_inputs(f"drain {i}", sampling, stream=True)
        client.async_stream_infer(MODEL_NAME, inputs, request_id=f"d{i}")
    # SIGTERM only once every stream has answered: the four are then surely in flight (on a
    # busy machine the first answer can come before the server has read the others).
    tokens = {f"d{i}": 0 for i in range(4)}
    reasons: dict[str, str] = {}
    early: list[Any] = []
    while len({r.get_response().id for r in early}) < 4:
        result, error = results.get(timeout=120)
        assert error is None, error
        early.append(result)

    proc.send_signal(signal.SIGTERM)
    # Draining: no longer ready, and new requests are refused as unavailable.
    for _ in range(100):
        if httpx.get(health).status_code == 400:
            break
    assert httpx.get(health).status_code == 400
    late = grpcclient.InferenceServerClient(server.grpc_url)
    late_results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    late.start_stream(callback=lambda result, error: late_results.put((result, error)))
    late.async_stream_infer(MODEL_NAME, generate_inputs("late", sampling))
    _, late_error = late_results.get(timeout=60)
    late.stop_stream()
    late.close()
    assert late_error is not None and "shutting down" in str(late_error)

    # Every request admitted before SIGTERM runs to its end.
    for result in early:
        tokens[result.get_response().id] += count_of(result, "num_output_tokens")
        if is_final(result):
            reasons[result.get_response().id] = text_of(result, "finish_reason")
    while len(reasons) < 4:
        result, error = results.get(timeout=120)
        # Seen once in CI (an empty InferenceServerException mid-drain, not reproduced in
        # repeated runs since): say enough to diagnose it if it comes back.
        assert error is None, (
            f"stream error {error.status()!r} {error.message()!r} after {reasons} finished, "
            f"tokens {tokens}; server log:\n{server.log.read_text()[-3000:]}"
        )
        request_id = result.get_response().id
        tokens[request_id] += count_of(result, "num_output_tokens")
        if is_final(result):
            reasons[request_id] = text_of(result, "finish_reason")
    client.stop_stream()
    client.close()
    assert tokens == {f"d{i}": 600 for i in range(4)}
    assert set(reasons.values()) == {"length"}
    assert proc.wait(timeout=60) == 0
    assert "drained" in server.log.read_text()


def test_a_model_that_fails_to_load_stops_the_start(demo_model_dir, tmp_path) -> None:
    repository = write_repository(tmp_path / "repo", tmp_path / "no-such-weights")
    proc = launch(repository, tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "KSERVE READY" not in out
    log = (tmp_path / "kserve.log").read_text()
    assert "model failed to load, not serving" in log and "no-such-weights" in log


def test_an_unusable_repository_stops_the_start(demo_model_dir, tmp_path) -> None:
    repository = write_repository(tmp_path / "repo", demo_model_dir)
    (repository / MODEL_NAME / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    proc = launch(repository, tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "KSERVE READY" not in out
    assert "backend 'onnxruntime' is not served here" in (tmp_path / "kserve.log").read_text()


def test_engine_arguments_the_cpu_engine_refuses_stop_the_start(demo_model_dir, tmp_path) -> None:
    repository = write_repository(tmp_path / "repo", demo_model_dir, quantization="awq")
    proc = launch(repository, tmp_path)
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "quantization" in (tmp_path / "kserve.log").read_text()
    json.loads((repository / MODEL_NAME / "1" / "model.json").read_text())  # still valid JSON


def test_serve_kserve_in_process_reports_ports_and_stops_cleanly(model_repository) -> None:
    from serving.engine.core import load_engine
    from serving.kserve.server import serve_kserve

    engine = load_engine(model_repository / MODEL_NAME / "1", name=MODEL_NAME)

    async def main() -> tuple[int, int, int]:
        stop = asyncio.Event()
        ports: list[int] = []

        def ready(http: int, grpc: int, metrics: int) -> None:
            ports.extend((http, grpc, metrics))
            stop_soon.set()

        stop_soon = asyncio.Event()
        task = asyncio.create_task(
            serve_kserve(
                [engine], http_port=0, grpc_port=0, metrics_port=0, ready_callback=ready, stop=stop
            )
        )
        await stop_soon.wait()
        async with httpx.AsyncClient() as client:
            ready_answer = await client.get(f"http://127.0.0.1:{ports[0]}/v2/health/ready")
            metrics = await client.get(f"http://127.0.0.1:{ports[2]}/metrics")
        assert ready_answer.status_code == 200
        assert "nv_inference_request_success" in metrics.text
        stop.set()
        await asyncio.wait_for(task, 30)
        return ports[0], ports[1], ports[2]

    http, grpc, metrics = asyncio.run(main())
    assert not engine.ready  # shut down with the servers
    assert all(_refused(port) for port in (http, grpc, metrics))
