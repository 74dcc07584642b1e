"""Loading: auto-complete, the arguments of initialize, and each way a model fails to load,
reported with its reason while nothing is left running."""

from __future__ import annotations

import json

import numpy as np
import psutil
import pytest

from serving.python_backend import ModelLoadError, PythonModelHandle, State
from tests.serving.python_backend.helpers import MODELS, request, run


def test_auto_complete_config_declares_the_tensors_and_initialize_sees_them():
    async def scenario():
        handle = PythonModelHandle(MODELS / "autocomplete")
        await handle.load()
        try:
            config = handle.config_dict()
            assert config["max_batch_size"] == 2
            assert "dynamic_batching" in config
            assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
            assert config["input"][0]["optional"] is True
            assert config["input"][1]["dims"] == [4]
            ones = np.ones((1, 4), np.float32)
            response = await handle.infer(request(("INPUT1", "FP32", ones)))
            assert response.output("OUTPUT0").data.tolist() == ones.tolist()
            args = json.loads(response.output("ARGS").data[0, 0])
            assert set(args) == {
                "model_config",
                "model_instance_kind",
                "model_instance_device_id",
                "model_repository",
                "model_version",
                "model_name",
            }
            assert args["model_name"] == "autocomplete" and args["model_version"] == "1"
            assert args["model_instance_kind"] == "CPU"
            assert args["model_repository"] == str(MODELS / "autocomplete")
            seen = json.loads(args["model_config"])
            assert seen["input"][1] == {**seen["input"][1], "data_type": "TYPE_FP32", "dims": [4]}
            assert seen["instance_group"][0]["name"] == "autocomplete_0"
        finally:
            await handle.close()

    run(scenario())


def stub_processes() -> list[psutil.Process]:
    """This test process's model processes still running."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running()
        and p.status() != psutil.STATUS_ZOMBIE
        and "serving.python_backend.stub" in " ".join(p.cmdline())
    ]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("no_class", "does not define the class TritonPythonModel"),
        ("bad_import", "ModuleNotFoundError: No module named 'a_module_that_does_not_exist'"),
        ("init_raises", "Failed to initialize Python stub: RuntimeError: weights are missing"),
    ],
)
def test_a_model_that_cannot_load_says_why_and_leaves_nothing_running(model, expected):
    async def scenario():
        handle = PythonModelHandle(MODELS / model)
        with pytest.raises(ModelLoadError) as caught:
            await handle.load()
        assert expected in str(caught.value)
        assert handle.state == State.FAILED and expected in (handle.failure or "")
        assert not handle.is_ready()
        assert not stub_processes()

    run(scenario())


def test_the_models_is_ready_is_consulted():
    async def scenario():
        handle = PythonModelHandle(MODELS / "not_ready")
        await handle.load()
        try:
            assert handle.is_ready()  # the process is healthy
            assert await handle.model_ready() is False  # but the model says it is not
        finally:
            await handle.close()

    run(scenario())


def test_a_missing_version_or_model_file_is_a_load_error(tmp_path):
    model = tmp_path / "empty"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('backend: "python"\n')

    async def scenario():
        with pytest.raises(ModelLoadError, match="Python model file not found"):
            await PythonModelHandle(model).load()
        with pytest.raises(ModelLoadError, match=r"version directory .* is missing"):
            await PythonModelHandle(model, version="7").load()

    run(scenario())


def test_an_auto_complete_that_contradicts_the_config_is_a_load_error(tmp_path):
    model = tmp_path / "contradicts"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    @staticmethod\n"
        "    def auto_complete_config(config):\n"
        "        config.add_input({'name': 'A', 'data_type': 'TYPE_FP32', 'dims': [1]})\n"
        "        return config\n"
        "\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )

    async def scenario():
        with pytest.raises(ModelLoadError) as caught:
            await PythonModelHandle(model).load()
        message = str(caught.value)
        assert (
            "auto_complete_config failed: ValueError: unable to load model 'contradicts'" in message
        )
        assert (
            "configuration expects datatype TYPE_INT32 for input 'A', model provides TYPE_FP32"
            in message
        )
        assert not stub_processes()

    run(scenario())
