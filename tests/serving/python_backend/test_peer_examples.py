"""Triton's own python_backend examples (``peer_models/``, unchanged) through the runner, with
what their ``client.py`` sends and checks: random ``[4]`` FP32 inputs, request id ``"1"``,
outputs ``OUTPUT0``/``OUTPUT1``, ``allclose`` on the sum and the difference."""

from __future__ import annotations

import numpy as np
import pytest

from serving.python_backend import PythonModelHandle
from tests.serving.python_backend.helpers import PEERS, request, run


async def _client(model: str) -> None:
    handle = PythonModelHandle(PEERS / model)
    await handle.load()
    try:
        input0_data = np.random.rand(4).astype(np.float32)
        input1_data = np.random.rand(4).astype(np.float32)
        response = await handle.infer(
            request(
                ("INPUT0", "FP32", input0_data),
                ("INPUT1", "FP32", input1_data),
                outputs=("OUTPUT0", "OUTPUT1"),
                request_id=str(1),
            )
        )
        output0 = response.output("OUTPUT0")
        output1 = response.output("OUTPUT1")
        assert output0 is not None and output1 is not None
        assert output0.datatype == "FP32" and output0.data.shape == (4,)
        assert np.allclose(input0_data + input1_data, output0.data)
        assert np.allclose(input0_data - input1_data, output1.data)
    finally:
        await handle.close()


def test_add_sub_example(capfd):
    run(_client("add_sub"))
    # finalize() ran in the model's process on close (the example prints from it).
    assert "Cleaning up..." in capfd.readouterr().out


def test_pytorch_example():
    pytest.importorskip("torch")
    run(_client("pytorch"))
