"""BLS from a model to other models of the same server (here: a router of real handles), and
the custom metrics, logs, parameters and paths a model sees."""

from __future__ import annotations

import json
import logging

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from serving.python_backend import PythonModelHandle
from tests.serving.python_backend.helpers import MODELS, PEERS, Router, request, run


def test_bls_reaches_other_models_sync_async_and_decoupled():
    async def scenario():
        router = Router()
        for path in (PEERS / "add_sub", MODELS / "repeat", MODELS / "bls_caller"):
            await router.handle(path).load()
        try:
            a = np.array([1, 2, 3, 4], np.float32)
            b = np.array([0.5, 0.5, 0.5, 0.5], np.float32)
            response = await router.handles["bls_caller"].infer(
                request(("A", "FP32", a), ("B", "FP32", b))
            )
            assert response.output("SUM").data.tolist() == (a + b).tolist()
            assert response.output("DIFF").data.tolist() == (a - b).tolist()
            assert response.output("REPEATED").data.tolist() == [7, 8, 9]
            missing = response.output("MISSING").data[0].decode()
            assert missing == "Request for unknown model: 'not_served' is not found"
        finally:
            await router.close()

    run(scenario())


def test_custom_metrics_logs_and_request_details(caplog):
    async def scenario():
        handle = PythonModelHandle(MODELS / "observed")
        await handle.load()
        try:
            for x in (5.0, 50.0):
                response = await handle.infer(
                    request(
                        ("X", "FP64", np.array([x])),
                        request_id=f"req-{x:g}",
                        parameters={"temperature": 3, "tag": "a"},
                    )
                )
            assert response.output("COUNT").data.tolist() == [2.0]
            info = json.loads(response.output("INFO").data[0])
            assert info == {
                "greeting": "hello",
                "parameters": {"temperature": 3, "tag": "a"},
                "request_id": "req-50",
                "model_dir": str(MODELS / "observed" / "1"),
                "requested": ["COUNT", "INFO"],
                "negative_increment": "Failed to increment metric value: "
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                "non-negative values.",
            }
            text = handle.metrics_text()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert families["observed_requests"].type == "counter"
            assert [(s.labels, s.value) for s in families["observed_requests"].samples] == [
                ({"model": "observed", "version": "1"}, 2.0)
            ]
            assert families["observed_last_value"].samples[0].value == 50.0
            histogram = {
                (s.name, s.labels.get("le")): s.value for s in families["observed_x"].samples
            }
            assert histogram[("observed_x_bucket", "1.0")] == 0
            assert histogram[("observed_x_bucket", "10.0")] == 1
            assert histogram[("observed_x_bucket", "+Inf")] == 2
            assert histogram[("observed_x_sum", None)] == 55.0
            assert histogram[("observed_x_count", None)] == 2
            # Triton writes counters under their own name, without prometheus-client's _total.
            assert 'observed_requests{model="observed",version="1"} 2.0' in text
        finally:
            await handle.close()
        assert handle.metrics_text() == ""  # the families go with the model

    with caplog.at_level(logging.INFO, logger="serving.python_backend.model.observed"):
        run(scenario())
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    source = (MODELS / "observed" / "1" / "model.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "log_info" in text)
    assert (logging.INFO, f"model.py:{line}] initialized observed") in messages
    assert any(level == logging.WARNING and m.endswith("] saw 50.0") for level, m in messages)
