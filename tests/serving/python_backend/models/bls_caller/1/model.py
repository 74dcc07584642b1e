"""BLS: add_sub with exec() and async_exec(), the decoupled `repeat` with exec(decoupled=True),
and a model that is not served."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
            )
            summed = call.exec()
            if summed.has_error():
                raise pb_utils.TritonModelException(summed.error().message())
            other = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
            )
            diff = (await asyncio.gather(other.async_exec()))[0]
            repeated = []
            stream = pb_utils.InferenceRequest(
                model_name="repeat",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([7, 8, 9], np.int32))],
            ).exec(decoupled=True)
            for response in stream:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    repeated.append(
                        int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                    )
            missing = pb_utils.InferenceRequest(
                model_name="not_served",
                requested_output_names=["X"],
                inputs=[pb_utils.Tensor("X", a)],
            ).exec()
            total = pb_utils.get_output_tensor_by_name(summed, "OUTPUT0").as_numpy()
            difference = pb_utils.get_output_tensor_by_name(diff, "OUTPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("SUM", total),
                pb_utils.Tensor("DIFF", difference),
                pb_utils.Tensor("REPEATED", np.array(repeated, np.int32)),
                pb_utils.Tensor("MISSING", np.array([missing.error().message()], dtype=object)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
