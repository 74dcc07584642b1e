"""An author's code failing: exceptions and error responses of execute, a crash, a hang and a
memory blow-up each end in a clear error; the handle can restart the model."""

from __future__ import annotations

import numpy as np
import pytest

from serving.python_backend import ModelError, PythonModelHandle, State
from tests.serving.python_backend.helpers import MODELS, PEERS, request, run


def mode(value: int):
    return request(("MODE", "INT32", np.array([value], np.int32)))


async def expect_error(handle: PythonModelHandle, value: int) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await handle.infer(mode(value))
    return caught.value


def test_execute_errors_become_error_responses_and_the_model_keeps_serving(capfd):
    async def scenario():
        handle = PythonModelHandle(MODELS / "faulty")
        await handle.load()
        try:
            raised = await expect_error(handle, 1)
            assert raised.code == "INTERNAL"
            assert raised.message.startswith(
                "Failed to process the request(s) for model 'faulty', message: ValueError: "
                "mode 1 is not allowed"
            )
            # The caller learns the error, not the serving machine's paths; the traceback goes
            # to the instance's log (the stub's stderr).
            assert "model.py" not in raised.message and "At:" not in raised.message
            logged = capfd.readouterr().err
            assert "model 'faulty': execute failed:" in logged
            assert "ValueError: mode 1 is not allowed" in logged
            assert "model.py" in logged  # where it was raised
            answered = await expect_error(handle, 2)
            assert (answered.code, answered.message) == ("NOT_FOUND", "no such thing")
            wrong_count = await expect_error(handle, 6)
            assert "Number of InferenceResponse objects do not match" in wrong_count.message
            response = await handle.infer(mode(0))
            assert response.output("OUT").data.tolist() == [0]
            through_sender = await handle.infer(mode(7))
            assert through_sender.output("OUT").data.tolist() == [7]
            assert handle.stats.execution_count == 5 and handle.stats.inference_count == 5
        finally:
            await handle.close()

    run(scenario())


def test_a_crash_fails_the_request_and_the_model_can_be_restarted():
    async def scenario():
        handle = PythonModelHandle(MODELS / "faulty")
        neighbour = PythonModelHandle(PEERS / "add_sub")
        await handle.load()
        await neighbour.load()
        try:
            crashed = await expect_error(handle, 3)
            assert crashed.code == "INTERNAL"
            assert "Stub process 'faulty_0_0' is not healthy" in crashed.message
            assert "exited with code 3" in crashed.message
            assert handle.state == State.FAILED and not handle.is_ready()
            refused = await expect_error(handle, 0)
            assert refused.code == "UNAVAILABLE" and "exited with code 3" in refused.message
            # Another model of the same server is untouched.
            ones = np.ones(4, np.float32)
            summed = await neighbour.infer(
                request(("INPUT0", "FP32", ones), ("INPUT1", "FP32", ones))
            )
            assert summed.output("OUTPUT0").data.tolist() == [2.0] * 4
            await handle.restart()
            assert (await handle.infer(mode(0))).output("OUT").data.tolist() == [0]
        finally:
            await handle.close()
            await neighbour.close()

    run(scenario())


def test_a_hung_execute_is_stopped_after_the_timeout():
    async def scenario():
        handle = PythonModelHandle(MODELS / "faulty", execute_timeout_s=1.0)
        await handle.load()
        try:
            hung = await expect_error(handle, 4)
            assert "execute of model 'faulty' did not return within 1 s" in hung.message
            assert handle.state == State.FAILED
            await handle.restart()
            assert (await handle.infer(mode(0))).output("OUT").data.tolist() == [0]
        finally:
            await handle.close()

    run(scenario())


def test_a_memory_blow_up_is_an_error_of_that_model_only():
    async def scenario():
        handle = PythonModelHandle(MODELS / "faulty", memory_limit_bytes=3 * 2**30)
        await handle.load()
        try:
            blown = await expect_error(handle, 5)
            assert "MemoryError" in blown.message
            assert handle.is_ready()
            assert (await handle.infer(mode(0))).output("OUT").data.tolist() == [0]
        finally:
            await handle.close()

    run(scenario())
