"""Two model instances: two processes, each initialized, each executing its own batches."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily(
            name="two_instances_initialized",
            description="initialize calls",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.family = family
        self.metric = family.Metric(labels={"model": args["model_name"]})
        self.metric.increment(1)

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(float(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0]))
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))
            responses.append(pb_utils.InferenceResponse([pid]))
        return responses
