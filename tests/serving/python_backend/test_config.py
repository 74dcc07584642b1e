"""config.pbtxt into Triton's ModelConfig and out as the JSON Triton gives a model."""

from __future__ import annotations

import json

import pytest

from serving.python_backend import config as model_config
from tests.serving.python_backend.helpers import MODELS, PEERS


def test_the_json_is_tritons_field_names_enum_names_and_integer_dims():
    config = model_config.read_config(MODELS / "batcher")
    model_config.normalize(config)
    data = json.loads(model_config.to_json(config))
    assert data["name"] == "batcher" and data["backend"] == "python"
    assert data["input"][0]["data_type"] == "TYPE_INT32" and data["input"][0]["dims"] == [-1]
    assert data["input"][1]["optional"] is True
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 300000
    assert data["max_batch_size"] == 8
    assert data["instance_group"] == [
        {**data["instance_group"][0], "name": "batcher_0", "count": 1, "kind": "KIND_CPU"}
    ]
    assert data["version_policy"] == {"latest": {"num_versions": 1}}
    again = model_config.from_json(model_config.to_json(config), "test")
    assert again == config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "other"\nbackend: "python"', "does not match its directory"),
        ('backend: "onnxruntime"', "backend 'onnxruntime' is not 'python'"),
        ('platform: "pytorch_libtorch"', "'platform' must not be set"),
        ("input [ { name: ", "not a valid model configuration"),
    ],
)
def test_config_files_that_cannot_be_served(tmp_path, text, message):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.pbtxt").write_text(text)
    with pytest.raises(model_config.ConfigError, match=message):
        model_config.read_config(model)


@pytest.mark.parametrize(
    ("io", "message"),
    [
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 0 ] } ]', "dimension must be"),
        ('input [ { name: "A" data_type: TYPE_FP32 } ]', "must specify 'dims'"),
        ('output [ { name: "A" dims: [ 1 ] } ]', "must specify 'data_type'"),
        ('input [ { name: "A" data_type: TYPE_BF16 dims: [ 1 ] } ]', "TYPE_BF16 is not supported"),
    ],
)
def test_tensors_that_triton_refuses_at_load(tmp_path, io, message):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.pbtxt").write_text(f'backend: "python"\n{io}\n')
    config = model_config.read_config(model)
    with pytest.raises(model_config.ConfigError, match=message):
        model_config.validate(config)


def test_the_latest_version_is_served():
    config = model_config.read_config(PEERS / "add_sub")
    assert model_config.find_version(PEERS / "add_sub", config, None).name == "1"
