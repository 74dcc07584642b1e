"""Reports how many requests each execute call got; each request keeps its own tensors."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            rows = data.shape[0]
            outputs = [
                pb_utils.Tensor("OUT", data * 2),
                pb_utils.Tensor("BATCH", np.full((rows, 1), len(requests), np.int32)),
            ]
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            if text is not None:
                lengths = [[len(item[0])] for item in text.as_numpy()]
                outputs.append(pb_utils.Tensor("TEXT_LEN", np.array(lengths, np.int32)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
