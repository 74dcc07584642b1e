"""Fails on demand, the ways an author's code can fail."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        if mode == 1:
            raise ValueError("mode 1 is not allowed")
        if mode == 2:
            error = pb_utils.TritonError("no such thing", pb_utils.TritonError.NOT_FOUND)
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if mode == 3:
            os._exit(3)
        if mode == 4:
            time.sleep(3600)
        if mode == 5:
            np.ones(2**34, dtype=np.uint8)  # 16 GiB, past the memory limit the test sets
        if mode == 6:
            return []
        if mode == 7:  # default mode may answer through the response sender too (24.06+)
            for request in requests:
                out = pb_utils.Tensor("OUT", np.array([7], np.int32))
                request.get_response_sender().send(
                    pb_utils.InferenceResponse([out]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            return None
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([mode], np.int32))])
            for _ in requests
        ]
