"""The OpenAI-compatible front end of a serving instance.

It turns OpenAI requests into Triton vLLM-backend inference requests and reaches the engine
only through ``tritonclient`` over KServe v2 gRPC, so the same code drives the CPU engine
(``serving.kserve``) and real Triton in the GPU image. See :func:`serving.frontend.app.create_app`.
"""

from serving.frontend.app import create_app
from serving.frontend.settings import Settings

__all__ = ["Settings", "create_app"]
