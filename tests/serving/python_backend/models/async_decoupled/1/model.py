"""async def execute in decoupled mode: the next request starts while one waits. Each response
reports how many executions were running at once at most."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.running = 0
        self.peak = 0

    async def execute(self, requests):
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            for request in requests:
                sender = request.get_response_sender()
                wait = float(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()[0])
                if wait < 0:
                    raise RuntimeError("negative wait")
                await asyncio.sleep(wait)
                peak = pb_utils.Tensor("PEAK", np.array([self.peak], np.int32))
                sender.send(
                    pb_utils.InferenceResponse([peak]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        finally:
            self.running -= 1
