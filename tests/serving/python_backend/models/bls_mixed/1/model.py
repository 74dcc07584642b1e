"""BLS across backends: a decoupled vLLM-backend model (named by the request parameter
`target`) called with exec(decoupled=True), and the decoupled `repeat` called with a plain
exec(), which the server refuses."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters())["target"]
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            sampling = json.dumps({"max_tokens": 3, "temperature": 0})
            call = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["text_output"],
                inputs=[
                    pb_utils.Tensor("text_input", prompt.astype(object)),
                    pb_utils.Tensor("sampling_parameters", np.array([sampling], dtype=object)),
                    pb_utils.Tensor("exclude_input_in_output", np.array([True])),
                ],
            )
            text = b""
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "text_output")
                if out is not None:
                    text += out.as_numpy()[0]
            refused = pb_utils.InferenceRequest(
                model_name="repeat",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([1], np.int32))],
            ).exec()
            outputs = [
                pb_utils.Tensor("TEXT", np.array([text], dtype=object)),
                pb_utils.Tensor("REFUSAL", np.array([refused.error().message()], dtype=object)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
