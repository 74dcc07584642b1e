"""The model configuration of Triton's vLLM backend: the tensors its ``auto_complete_config``
adds to whatever ``config.pbtxt`` declares (``triton-inference-server/vllm_backend``,
``src/model.py``), a decoupled transaction policy and ``max_batch_size: 0``.

At the bottom of ``serving``: the model repository's reader (:mod:`serving.repository`)
completes a configuration as Triton would, and the KServe server (:mod:`serving.kserve`)
describes and checks tensors by it; neither needs the other for that.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

BACKEND = "vllm"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe protocol string: BYTES, BOOL, FP32, UINT32
    dims: tuple[int, ...]
    optional: bool = False


_CONFIG_TYPES = {"BYTES": mc.TYPE_STRING, "BOOL": mc.TYPE_BOOL, "FP32": mc.TYPE_FP32}
_CONFIG_TYPES |= {"UINT32": mc.TYPE_UINT32}
_PROTOCOL_TYPES = {v: k for k, v in _CONFIG_TYPES.items()}

RETURN_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)
INPUTS = (
    TensorSpec("text_input", "BYTES", (1,)),
    TensorSpec("image", "BYTES", (-1,), optional=True),
    TensorSpec("stream", "BOOL", (1,), optional=True),
    TensorSpec("sampling_parameters", "BYTES", (1,), optional=True),
    TensorSpec("exclude_input_in_output", "BOOL", (1,), optional=True),
    *(TensorSpec(flag, "BOOL", (1,), optional=True) for flag in RETURN_FLAGS),
    TensorSpec("embedding_request", "BYTES", (1,), optional=True),
)
OUTPUTS = (
    TensorSpec("text_output", "BYTES", (-1,)),
    TensorSpec("finish_reason", "BYTES", (-1,)),
    TensorSpec("cumulative_logprob", "FP32", (-1,)),
    TensorSpec("logprobs", "BYTES", (-1,)),
    TensorSpec("num_input_tokens", "UINT32", (1,)),
    TensorSpec("num_output_tokens", "UINT32", (-1,)),
)


def auto_complete(config: mc.ModelConfig) -> None:
    """What the backend's ``auto_complete_config`` does to a model's configuration."""
    have_inputs = {i.name for i in config.input}
    for spec in INPUTS:
        if spec.name not in have_inputs:
            config.input.add(
                name=spec.name,
                data_type=_CONFIG_TYPES[spec.datatype],
                dims=list(spec.dims),
                optional=spec.optional,
            )
    have_outputs = {o.name for o in config.output}
    for spec in OUTPUTS:
        if spec.name not in have_outputs:
            config.output.add(
                name=spec.name, data_type=_CONFIG_TYPES[spec.datatype], dims=list(spec.dims)
            )
    config.model_transaction_policy.decoupled = True
    config.max_batch_size = 0


def input_specs(config: mc.ModelConfig) -> dict[str, TensorSpec]:
    return {
        i.name: TensorSpec(i.name, _PROTOCOL_TYPES[i.data_type], tuple(i.dims), i.optional)
        for i in config.input
    }


def output_specs(config: mc.ModelConfig) -> dict[str, TensorSpec]:
    return {
        o.name: TensorSpec(o.name, _PROTOCOL_TYPES[o.data_type], tuple(o.dims))
        for o in config.output
    }
