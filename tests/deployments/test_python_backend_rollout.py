"""A Python-backend model through the whole platform: registered with its I/O spec and model.py,
materialized, packaged, deployed Red-Black by the controller in a real worker, called with
``tritonclient`` over KServe v2 (HTTP through the gateway, gRPC on the instance), its
``nv_inference_*`` counts scraped, then rolled onto a second version of the same interface under
load with no failed request. A version that changes the tensors is refused for Red-Black."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from django.core.exceptions import ValidationError
from django.utils import timezone
from tritonclient.utils import InferenceServerException

from portal.deployments import services
from portal.deployments.rollout.rollout_health import scrape_counts
from portal.metrics import services as metrics
from portal.metrics.services import scrape_live_instances
from portal.web.snippets import call_context
from tests.deployments.conftest import USER
from tests.deployments.rollout_helpers import BearerKey, explain, live_instances, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVED_NAME = "search--scaler"

IO_SPEC = {
    "inputs": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
    "outputs": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
}

#: Y = X * FACTOR: each version's answers say which version gave them.
MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils

FACTOR = {factor}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = pb_utils.Tensor("Y", (x * FACTOR).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses
"""


def python_version(world, model, factor: float, io_spec=IO_SPEC):
    return world.version(
        model,
        backend="python",
        api_surface="grpc",
        engine_args={},
        io_spec=io_spec,
        python_model=MODEL_PY.format(factor=factor),
    )


def http_infer(client: httpclient.InferenceServerClient, values: list[float]) -> np.ndarray:
    x = httpclient.InferInput("X", [len(values)], "FP32")
    x.set_data_from_numpy(np.array(values, dtype=np.float32))
    return client.infer(SERVED_NAME, [x]).as_numpy("Y")


class KServeLoad:
    """Callers sending tritonclient HTTP requests through the gateway until stopped; each
    answer's factor (Y / X) is counted, each exception kept."""

    def __init__(self, url: str, key: str, clients: int = 2) -> None:
        self.url = url
        self.key = key
        self.factors: Counter[float] = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> KServeLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=60)
        client.register_plugin(BearerKey(self.key))
        while not self._stop.is_set():
            try:
                y = http_infer(client, [1.0, 2.0])
                self.factors[float(y[0])] += 1
            except Exception as exc:  # every kind of failure is a failed request here
                self.errors.append(repr(exc))
            time.sleep(0.01)


def test_a_python_backend_version_deploys_serves_and_rolls_red_black(
    rollout_world, settings, monkeypatch
):
    world = rollout_world
    model = world.model("scaler")
    assert f"{model.team.slug}--{model.slug}" == SERVED_NAME
    v1 = python_version(world, model, 1.0)
    v2 = python_version(world, model, 2.0)
    deployment = world.deploy(model, v1, replicas=1, stages=[50, 100], bake_seconds=3)

    def serving(version: int, timeout: float = 180):
        def done():
            deployment.refresh_from_db()
            assert deployment.observed_state not in ("failed", "aborted"), deployment.status_message
            return (
                deployment.observed_state == "serving"
                and deployment.target_version.number == version
            )

        wait_for(
            done,
            timeout,
            f"v{version} serving",
            explain=lambda: explain(deployment, world.run_root),
        )

    serving(1)
    gateway_v2 = world.gateway_url.removeprefix("http://") + f"/models/search/{model.slug}"
    http = httpclient.InferenceServerClient(gateway_v2)
    assert not http.is_model_ready(SERVED_NAME)  # no caller key: 401
    with pytest.raises(InferenceServerException, match="caller key is required"):
        http.get_model_metadata(SERVED_NAME)
    http.register_plugin(BearerKey(world.caller_key))
    assert http.is_model_ready(SERVED_NAME)
    assert http_infer(http, [1.5, -2.0]).tolist() == [1.5, -2.0]
    metadata = http.get_model_metadata(SERVED_NAME)
    assert [(t["name"], t["datatype"]) for t in metadata["inputs"]] == [("X", "FP32")]

    [instance] = live_instances(deployment)
    grpc = grpcclient.InferenceServerClient(instance.endpoints["kserve_grpc"])
    x = grpcclient.InferInput("X", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
    assert grpc.infer(SERVED_NAME, [x]).as_numpy("Y").tolist() == [1.0, 2.0, 3.0]
    # A refused request (wrong datatype) is the Python backend's own failure count.
    wrong = httpclient.InferInput("X", [1], "INT32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(Exception, match="X"):
        http.infer(SERVED_NAME, [wrong])
    # The programs the deployment page shows run as shown, over HTTP and gRPC.
    settings.GATEWAY_URL = world.gateway_url
    monkeypatch.setenv("MODEL_API_KEY", world.caller_key)  # where the snippets read the key
    context = call_context(deployment)
    assert context["kserve"].kserve_grpc == [instance.endpoints["kserve_grpc"]]
    for snippet in (context["snippet_http"], context["snippet_grpc"]):
        namespace: dict = {}
        exec(compile(snippet, "snippet", "exec"), namespace)
        assert namespace["result"].as_numpy("Y").tolist() == [1.0]
    counts = scrape_counts(instance.endpoints["metrics"])
    assert counts is not None and counts.success >= 4 and counts.failure >= 1, counts
    # The charts read the same families: requests and errors per second (no token or latency
    # families: those are the vLLM backend's).
    since = timezone.now() - timedelta(minutes=5)
    assert scrape_live_instances().up == 1
    [point] = metrics.series([deployment], since)
    assert point["requests_per_s"] > 0 and point["errors_per_s"] > 0, point
    assert point["generation_tokens_per_s"] in (None, 0), point

    # An I/O change is refused for Red-Black and advised to Versioned.
    changed = python_version(
        world, model, 3.0, io_spec={**IO_SPEC, "outputs": [{**IO_SPEC["outputs"][0], "name": "Z"}]}
    )
    advice = services.advise_strategy(model, changed)
    assert advice.strategy == "versioned" and advice.interface_changes
    with pytest.raises(ValidationError, match="changes the model's interface"):
        services.update_deployment(deployment, actor=USER, version=changed)

    with KServeLoad(gateway_v2, world.caller_key) as load:
        time.sleep(1)
        services.update_deployment(deployment, actor=USER, version=v2)
        serving(2)
        time.sleep(1)
    assert load.errors == []
    assert load.factors[1.0] > 0 and load.factors[2.0] > 0, load.factors
    assert http_infer(http, [1.0]).tolist() == [2.0]
