"""A KServe v2 server (gRPC + HTTP) over the CPU engine, speaking Triton's vLLM-backend tensor
contract so that ``tritonclient`` (and the front end built on it) cannot tell it from Triton.

Run it with ``python -m serving.kserve --model-repository DIR``; embed it with
:func:`serving.kserve.server.serve_kserve`.
"""
