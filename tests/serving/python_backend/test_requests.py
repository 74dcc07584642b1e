"""Requests: Triton's refusals before execute, dynamic batching of concurrent requests,
decoupled streams and cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.python_backend import ModelError, PythonModelHandle
from tests.serving.python_backend.helpers import MODELS, request, run

INTS = np.array([[1, 2, 3]], np.int32)


REFUSALS = [
    (
        [("IN", "FP32", INTS.astype(np.float32))],
        (),
        "[request id: r1] inference input 'IN' data-type is 'FP32', but model 'batcher' "
        "expects 'INT32'",
    ),
    (
        [("IN", "INT32", INTS[0])],
        (),
        "[request id: r1] unexpected shape for input 'IN' for model 'batcher'. Expected "
        "[-1,-1], got [3].",
    ),
    (
        [("IN", "INT32", np.zeros((9, 2), np.int32))],
        (),
        "[request id: r1] inference request batch-size must be <= 8 for 'batcher'",
    ),
    (
        [("TEXT", "BYTES", np.array([[b"x"]], dtype=object))],
        (),
        "[request id: r1] expected number of inputs between 1 and 2 but got 1 inputs for "
        "model 'batcher'. Got input(s) ['TEXT'], but missing required input(s) ['IN'].",
    ),
    (
        [("IN", "INT32", INTS), ("EXTRA", "INT32", INTS)],
        (),
        "[request id: r1] unexpected inference input 'EXTRA' for model 'batcher'",
    ),
    (
        [("IN", "INT32", INTS), ("TEXT", "BYTES", np.array([[b"a"], [b"b"]], dtype=object))],
        (),
        "[request id: r1] input 'TEXT' batch size does not match other inputs for 'batcher'",
    ),
    (
        [("IN", "INT32", INTS)],
        ("NOPE",),
        "[request id: r1] unexpected inference output 'NOPE' for model 'batcher'",
    ),
]


def test_requests_that_do_not_match_the_config_are_refused_before_execute():
    async def scenario():
        handle = PythonModelHandle(MODELS / "batcher")
        await handle.load()
        try:
            for tensors, outputs, message in REFUSALS:
                with pytest.raises(ModelError) as caught:
                    await handle.infer(request(*tensors, outputs=outputs, request_id="r1"))
                assert caught.value.code == "INVALID_ARG"
                assert message in caught.value.message
                assert not handle._in_flight and not handle._queue  # execute never saw it
            assert handle.stats.execution_count == 0
        finally:
            await handle.close()

    run(scenario())


def test_concurrent_requests_reach_one_execute_call_each_with_its_own_tensors():
    async def scenario():
        handle = PythonModelHandle(MODELS / "batcher")
        await handle.load()
        try:
            # 1 + 2 + 2 + 3 rows: exactly max_batch_size (8), so all four fit in one batch.
            inputs = [np.full((rows, 2), i, np.int32) for i, rows in enumerate((1, 2, 2, 3))]
            responses = await asyncio.gather(
                *(handle.infer(request(("IN", "INT32", data))) for data in inputs)
            )
            for data, response in zip(inputs, responses, strict=True):
                assert response.output("OUT").data.tolist() == (data * 2).tolist()
                assert response.output("BATCH").data.reshape(-1).tolist() == [4] * data.shape[0]
            # Only the requested output comes back, as Triton prunes the others.
            alone = await handle.infer(request(("IN", "INT32", INTS), outputs=("OUT",)))
            assert [t.name for t in alone.outputs] == ["OUT"]
        finally:
            await handle.close()

    run(scenario())


def test_bytes_are_passed_to_the_model_as_they_came_even_when_not_utf8():
    async def scenario():
        handle = PythonModelHandle(MODELS / "batcher")
        await handle.load()
        try:
            text = np.array([[b"\xff\xfe\x00"]], dtype=object)
            response = await handle.infer(
                request(("IN", "INT32", INTS), ("TEXT", "BYTES", text), outputs=("TEXT_LEN",))
            )
            assert response.output("TEXT_LEN").data.tolist() == [[3]]
        finally:
            await handle.close()

    run(scenario())


def test_a_decoupled_model_streams_its_responses_then_a_final_flag():
    async def scenario():
        handle = PythonModelHandle(MODELS / "repeat")
        await handle.load()
        try:
            assert handle.decoupled
            responses = [
                r
                async for r in handle.stream(
                    request(("IN", "INT32", np.array([4, 5, 6], np.int32)))
                )
            ]
            assert [r.output("OUT").data.tolist() for r in responses[:3]] == [[4], [5], [6]]
            assert [r.final for r in responses] == [False, False, False, True]
            assert responses[-1].outputs == [] and responses[-1].error is None
            with pytest.raises(ModelError) as caught:
                await handle.infer(request(("IN", "INT32", np.array([1], np.int32))))
            assert caught.value.code == "UNSUPPORTED"
        finally:
            await handle.close()

    run(scenario())


def test_leaving_a_stream_cancels_the_request_in_the_model():
    async def scenario():
        handle = PythonModelHandle(MODELS / "repeat")
        await handle.load()
        try:
            many = np.arange(200, dtype=np.int32)
            stream = handle.stream(
                request(("IN", "INT32", many), ("DELAY", "FP32", np.array([0.02], np.float32)))
            )
            got = []
            async with contextlib.aclosing(stream):
                async for response in stream:
                    got.append(response)
                    if len(got) == 2:
                        break
            # The model sees is_cancelled() and stops well before its 200 values; it counts
            # what it saw in a custom metric.
            for _ in range(200):
                text = handle.metrics_text()
                if 'repeat_cancelled{model="repeat"} 1.0' in text:
                    break
                await asyncio.sleep(0.05)
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert families["repeat_cancelled"].samples[0].value == 1.0
            assert not handle._in_flight
            # The model serves the next request normally.
            after = [
                r async for r in handle.stream(request(("IN", "INT32", np.array([1], np.int32))))
            ]
            assert after[0].output("OUT").data.tolist() == [1]
        finally:
            await handle.close()

    run(scenario())


def test_async_decoupled_executions_overlap_and_their_errors_reach_the_request():
    async def scenario():
        handle = PythonModelHandle(MODELS / "async_decoupled")
        await handle.load()
        try:

            async def call(wait: float) -> list:
                wait_tensor = ("WAIT", "FP32", np.array([wait], np.float32))
                return [r async for r in handle.stream(request(wait_tensor))]

            _, second = await asyncio.gather(call(1.0), call(1.0))
            # The second execute began while the first was still waiting.
            assert second[0].output("PEAK").data.tolist() == [2]
            failed = await call(-1.0)
            assert failed[-1].final and failed[-1].error is not None
            assert "RuntimeError: negative wait" in failed[-1].error.message
        finally:
            await handle.close()

    run(scenario())


def test_a_request_cancelled_while_queued_never_reaches_execute():
    async def scenario():
        handle = PythonModelHandle(MODELS / "repeat")
        await handle.load()
        try:
            slow = request(
                ("IN", "INT32", np.arange(10, dtype=np.int32)),
                ("DELAY", "FP32", np.array([0.05], np.float32)),
            )
            busy = asyncio.create_task(_collect(handle, slow))
            queued = asyncio.create_task(
                _collect(handle, request(("IN", "INT32", np.array([99], np.int32))))
            )
            while len(handle._queue) < 1:
                await asyncio.sleep(0.01)
            queued.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await queued
            assert not handle._queue
            first = await busy
            assert [r.output("OUT").data[0] for r in first[:-1]] == list(range(10))
            assert handle.stats.execution_count == 1  # the cancelled one never ran
        finally:
            await handle.close()

    run(scenario())


async def _collect(handle: PythonModelHandle, req) -> list:
    return [r async for r in handle.stream(req)]


def test_each_model_instance_is_a_process_of_its_own():
    async def scenario():
        handle = PythonModelHandle(MODELS / "two_instances")
        await handle.load()
        try:
            assert handle.instance_names == ["two_instances_0_0", "two_instances_0_1"]
            assert "two_instances_initialized" in handle.metrics_text()
            assert 'two_instances_initialized{model="two_instances"} 2.0' in handle.metrics_text()
            wait = ("WAIT", "FP32", np.array([0.5], np.float32))
            first, second = await asyncio.gather(
                handle.infer(request(wait)), handle.infer(request(wait))
            )
            pids = {first.output("PID").data[0], second.output("PID").data[0]}
            assert len(pids) == 2  # both ran, one in each process
        finally:
            await handle.close()

    run(scenario())
