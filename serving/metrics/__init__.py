"""Metrics of one serving instance.

:mod:`serving.metrics.vllm_metrics` writes vLLM-named metrics from the engine process into
prometheus-client's multiprocess directory; :mod:`serving.metrics.unified` merges them with the
engine's Triton-style endpoint into the instance's single ``/metrics``.
"""
