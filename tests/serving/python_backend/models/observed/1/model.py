"""Custom metrics of every kind, Logger, request parameters and ids, get_model_dir."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.greeting = config["parameters"]["greeting"]["string_value"]
        self.requests = pb_utils.MetricFamily(
            name="observed_requests",
            description="requests seen",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric(labels={"model": args["model_name"], "version": args["model_version"]})
        self.last = pb_utils.MetricFamily(
            name="observed_last_value", description="last X", kind=pb_utils.MetricFamily.GAUGE
        ).Metric(labels={"model": args["model_name"]})
        self.sizes = pb_utils.MetricFamily(
            name="observed_x", description="X values", kind=pb_utils.MetricFamily.HISTOGRAM
        ).Metric(labels={"model": args["model_name"]}, buckets=[1.0, 10.0, 100.0])
        pb_utils.Logger.log_info(f"initialized {args['model_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(x)
            self.sizes.observe(x)
            problem = ""
            try:
                self.requests.increment(-1)
            except pb_utils.TritonModelException as exc:
                problem = str(exc)
            pb_utils.Logger.log_warn(f"saw {x}")
            info = {
                "greeting": self.greeting,
                "parameters": json.loads(request.parameters()),
                "request_id": request.request_id(),
                "model_dir": pb_utils.get_model_dir(),
                "requested": sorted(request.requested_output_names()),
                "negative_increment": problem,
            }
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("COUNT", np.array([self.requests.value()])),
                        pb_utils.Tensor("INFO", np.array([json.dumps(info)], dtype=object)),
                    ]
                )
            )
        return responses
