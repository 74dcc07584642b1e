"""No tensors in config.pbtxt: auto_complete_config declares them (Triton's README example)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4], "optional": True}
        )
        auto_complete_model_config.add_input(
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}
        )
        auto_complete_model_config.add_output(
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}
        )
        auto_complete_model_config.add_output(
            {"name": "ARGS", "data_type": "TYPE_STRING", "dims": [1]}
        )
        auto_complete_model_config.set_max_batch_size(2)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            total = in1 if in0 is None else in1 + in0.as_numpy()
            args = np.array([json.dumps(self.args).encode()] * in1.shape[0], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", total),
                        pb_utils.Tensor("ARGS", args.reshape(-1, 1)),
                    ]
                )
            )
        return responses
