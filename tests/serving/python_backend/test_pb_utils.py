"""The pb_utils module itself, in this process: tensors, DLPack, errors, the ModelConfig of
auto_complete_config and the helpers, as Triton's README and utils module define them."""

from __future__ import annotations

import numpy as np
import pytest

from serving.python_backend import pb_utils


def test_error_codes_are_tritons():
    assert [c.name for c in pb_utils.ErrorCode] == [
        "UNKNOWN",
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
    ]
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    error = pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND)
    assert (error.message(), error.code()) == ("gone", pb_utils.TritonError.NOT_FOUND)
    assert issubclass(pb_utils.TritonModelException, Exception)


def test_bytes_tensors_are_object_arrays_of_bytes():
    tensor = pb_utils.Tensor("T", np.array(["héllo", "x"]))
    assert tensor.as_numpy().dtype == np.object_
    assert tensor.as_numpy().tolist() == ["héllo".encode(), b"x"]
    assert tensor.datatype() == "BYTES" and tensor.triton_dtype() == 13
    raw = pb_utils.serialize_byte_tensor(tensor.as_numpy())
    assert pb_utils.deserialize_bytes_tensor(raw).tolist() == tensor.as_numpy().tolist()
    with pytest.raises(pb_utils.TritonModelException, match="expects a numpy array"):
        pb_utils.Tensor("T", [1, 2])


def test_dlpack_round_trips_with_torch_on_cpu():
    torch = pytest.importorskip("torch")
    from torch.utils.dlpack import from_dlpack, to_dlpack

    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    from_capsule = pb_utils.Tensor.from_dlpack("A", to_dlpack(source))
    from_object = pb_utils.Tensor.from_dlpack("B", source)
    assert from_capsule.as_numpy().tolist() == source.tolist()
    assert from_object.shape() == [2, 3] and from_object.is_cpu()
    back = from_dlpack(pb_utils.Tensor("C", np.ones((2, 2), np.int64)).to_dlpack())
    assert back.dtype == torch.int64 and back.tolist() == [[1, 1], [1, 1]]
    with pytest.raises(pb_utils.TritonModelException, match="contiguous"):
        pb_utils.Tensor.from_dlpack("D", source.t())


def test_inference_response_and_request_objects():
    out = pb_utils.Tensor("OUT", np.zeros(2, np.float32))
    response = pb_utils.InferenceResponse(output_tensors=[out], parameters={"k": 1})
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert not response.has_error() and response.parameters() == '{"k": 1}'
    request = pb_utils.InferenceRequest(
        model_name="m", inputs=[out], requested_output_names=["Y"], parameters={"a": "b"}
    )
    assert pb_utils.get_input_tensor_by_name(request, "OUT") is out
    assert request.parameters() == '{"a": "b"}' and request.requested_output_names() == ["Y"]
    assert not request.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="parameters"):
        pb_utils.InferenceRequest(
            model_name="m", inputs=[], requested_output_names=[], parameters={"a": [1]}
        )


def config() -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig(
        '{"name": "m", "max_batch_size": 4, "input": [{"name": "A", "data_type": "TYPE_FP32", '
        '"dims": [2]}], "output": []}'
    )


def test_model_config_refuses_what_triton_refuses():
    cfg = config()
    cfg.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # same: fine
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32"):
        cfg.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2]})
    with pytest.raises(ValueError, match="the model expects dims \\[3\\]"):
        cfg.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="contains property other than"):
        cfg.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="missing 'dims' property"):
        cfg.add_output({"name": "B", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 4"):
        cfg.set_max_batch_size(2)
    cfg.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        cfg.set_model_transaction_policy({"decoupled": False})
    cfg.set_dynamic_batching()
    assert cfg.as_dict()["dynamic_batching"] == {}
    assert pb_utils.using_decoupled_model_transaction_policy(cfg.as_dict())
    assert pb_utils.get_input_config_by_name(cfg.as_dict(), "A")["dims"] == [2]
    assert pb_utils.get_output_config_by_name(cfg.as_dict(), "Z") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16


def test_the_author_module_is_pb_utils_under_tritons_name():
    import importlib
    import sys

    from serving.python_backend.stub import AUTHOR_PATH

    sys.path.insert(0, AUTHOR_PATH)
    try:
        module = importlib.import_module("triton_python_backend_utils")
    finally:
        sys.path.remove(AUTHOR_PATH)
        sys.modules.pop("triton_python_backend_utils", None)
    assert module.Tensor is pb_utils.Tensor
    assert module.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert module.MetricFamily.HISTOGRAM == pb_utils.MetricKind.HISTOGRAM
