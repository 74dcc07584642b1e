"""Decoupled: one response per element of IN, then a flag-only final response. Stops early
with a CANCELLED error when the client cancels, and counts what it saw."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily(
            name="repeat_cancelled",
            description="requests seen cancelled",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.cancelled = family.Metric(labels={"model": args["model_name"]})
        self.family = family

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            pause = 0.0 if delay is None else float(delay.as_numpy()[0])
            for value in values:
                if request.is_cancelled():
                    self.cancelled.increment(1)
                    sender.send(
                        pb_utils.InferenceResponse(
                            error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                        ),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    break
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                time.sleep(pause)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
