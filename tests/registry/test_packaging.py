"""Model packages: Triton repositories for both backends, checked with Triton's own schema."""

from __future__ import annotations

import hashlib
import json
import tarfile
import time

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from portal.registry.lifecycle import transition_version
from portal.registry.models import (
    ApiSurface,
    Backend,
    ModelVersion,
    PlatformRelease,
    ToolCallParser,
    VersionState,
)
from portal.registry.packaging import (
    PackagingError,
    build_package,
    package_version,
    weights_dir,
)
from portal.registry.services import set_default_release
from portal.registry.tasks import package_version_task
from serving.constraints import LOGITS_PROCESSOR
from serving.package import MANIFEST_NAME, TOOL_CALL_PARSER, TOOL_CALL_PARSERS
from tests.factories import make_model, make_version

pytestmark = pytest.mark.django_db

MODEL_PY = """\
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]

    def finalize(self):
        pass
"""
IO_SPEC = {
    "max_batch_size": 16,
    "inputs": [
        {"name": "INPUT_IDS", "data_type": "TYPE_INT64", "dims": [-1]},
        {"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1], "optional": True},
    ],
    "outputs": [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
}


@pytest.fixture(autouse=True)
def model_cache(settings, tmp_path):
    settings.MODEL_CACHE_ROOT = tmp_path / "model-cache"
    return settings.MODEL_CACHE_ROOT


def materialized(version: ModelVersion) -> ModelVersion:
    transition_version(version, VersionState.MATERIALIZING)
    return transition_version(version, VersionState.MATERIALIZED)


def read_archive(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def parse_config(data: bytes) -> mc.ModelConfig:
    return text_format.Parse(data.decode(), mc.ModelConfig())


@pytest.mark.parametrize(
    "engine_args",
    [
        {},
        {"dtype": "bfloat16", "max_model_len": 8192, "gpu_memory_utilization": 0.85},
        {"tensor_parallel_size": 4, "enable_prefix_caching": True, "max_num_seqs": 128},
        {"quantization": "awq", "enforce_eager": True, "enable_log_requests": False},
    ],
)
def test_vllm_package(team, release, artifact_root, engine_args):
    model = make_model(team, "support-bot")
    version = make_version(model, artifact_root, engine_args=engine_args)
    package = build_package(version)
    files = read_archive(package.path)
    name, number = "search--support-bot", version.number
    assert set(files) == {f"{name}/config.pbtxt", f"{name}/{number}/model.json", MANIFEST_NAME}

    config = parse_config(files[f"{name}/config.pbtxt"])
    assert (config.name, config.backend, config.max_batch_size) == (name, "vllm", 0)
    assert config.model_transaction_policy.decoupled
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_MODEL
    assert list(config.version_policy.specific.versions) == [number]

    model_json = json.loads(files[f"{name}/{number}/model.json"])
    weights = str(weights_dir(version))
    assert model_json == {
        "model": weights,
        "tokenizer": weights,
        "disable_log_stats": False,
        **engine_args,
        "logits_processors": [LOGITS_PROCESSOR],
    }
    assert "vllm" not in files[f"{name}/{number}/model.json"].decode().lower().replace("vllm_", "")


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_vllm_package_names_the_tool_call_format_for_the_front_end(
    team, release, artifact_root, parser
):
    model = make_model(team, "agent")
    version = make_version(model, artifact_root, tool_call_parser=parser)
    files = read_archive(build_package(version).path)
    config = parse_config(files["search--agent/config.pbtxt"])
    assert config.parameters[TOOL_CALL_PARSER].string_value == parser


def test_tool_call_formats_are_the_front_ends():
    assert tuple(ToolCallParser.values) == TOOL_CALL_PARSERS


def test_python_package(team, release, artifact_root):
    model = make_model(team, "scorer", task="ranking")
    version = make_version(
        model, artifact_root, backend=Backend.PYTHON, engine_args={}, io_spec=IO_SPEC,
        api_surface=ApiSurface.GRPC, python_model=MODEL_PY,
    )  # fmt: skip
    files = read_archive(build_package(version).path)
    config = parse_config(files["search--scorer/config.pbtxt"])
    assert (config.backend, config.max_batch_size) == ("python", 16)
    assert [
        (t.name, mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in config.input
    ] == [
        ("INPUT_IDS", "TYPE_INT64", [-1], False),
        ("MASK", "TYPE_BOOL", [-1], True),
    ]
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.output] == [
        ("SCORES", "TYPE_FP32", [-1, 4])
    ]
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert files[f"search--scorer/{version.number}/model.py"].decode() == MODEL_PY
    # model.py finds the version's artifact in the model cache through a config parameter.
    assert config.parameters["WEIGHTS_DIR"].string_value == str(weights_dir(version))


def test_python_model_taken_from_the_artifact(team, release, artifact_root):
    version = make_version(
        make_model(team, "scorer"), artifact_root, backend=Backend.PYTHON, engine_args={},
        io_spec=IO_SPEC, api_surface=ApiSurface.GRPC,
    )  # fmt: skip
    with pytest.raises(PackagingError, match=r"none was uploaded and .*model\.py is missing"):
        build_package(version)
    weights_dir(version).mkdir(parents=True)
    (weights_dir(version) / "model.py").write_text(MODEL_PY)
    files = read_archive(build_package(version).path)
    assert files[f"search--scorer/{version.number}/model.py"].decode() == MODEL_PY


def test_manifest_records_release_and_checksums(team, release, artifact_root):
    version = make_version(
        make_model(team), artifact_root, constraint_plugins=["platform-constraints"]
    )
    package = build_package(version)
    files = read_archive(package.path)
    manifest = json.loads(files[MANIFEST_NAME])
    assert manifest == package.manifest
    assert manifest["release"] == {
        "name": release.name, "triton_image": release.triton_image, "vllm_version": release.vllm_version,
    }  # fmt: skip
    assert (manifest["backend"], manifest["api_surface"], manifest["triton_embedded"]) == (
        "vllm", "openai+grpc", True,
    )  # fmt: skip
    assert manifest["constraint_plugins"] == ["platform-constraints"]
    listed = {entry["path"]: entry for entry in manifest["files"]}
    assert set(listed) == set(files) - {MANIFEST_NAME}
    for path, data in files.items():
        if path != MANIFEST_NAME:
            assert listed[path]["sha256"] == hashlib.sha256(data).hexdigest()
            assert listed[path]["size"] == len(data)
    assert package.digest == hashlib.sha256(package.path.read_bytes()).hexdigest()
    assert package.path.name == f"{package.digest}.tar"


def test_packaging_is_deterministic(team, release, artifact_root, model_cache):
    version = make_version(make_model(team), artifact_root, engine_args={"dtype": "half"})
    first = build_package(version)
    first_bytes = first.path.read_bytes()
    first.path.unlink()
    second = build_package(version)
    assert (second.digest, second.path.read_bytes()) == (first.digest, first_bytes)
    other = make_version(version.model, artifact_root, engine_args={"dtype": "float16"})
    assert build_package(other).digest != first.digest
    assert [p.name for p in (model_cache / "packages").iterdir()].count(f"{first.digest}.tar") == 1


def test_changing_the_default_release_keeps_existing_packages(team, release, artifact_root):
    version = make_version(make_model(team), artifact_root)
    before = build_package(version)
    newer = PlatformRelease.objects.create(
        name="triton-27.01", triton_image="nvcr.io/nvidia/tritonserver:27.01-vllm-python-py3",
        vllm_version="0.26.0", allowed_engine_args=release.allowed_engine_args,
    )  # fmt: skip
    set_default_release(newer)
    version.refresh_from_db()
    assert version.release == release
    assert build_package(version).digest == before.digest


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def execute(:\n", "does not parse: line 1"),
        ("class Other:\n    def execute(self, r): pass\n", "top-level class TritonPythonModel"),
        ("class TritonPythonModel:\n    def initialize(self, a): pass\n", "must define execute"),
    ],
)
def test_bad_model_py_fails_packaging_with_the_reason(
    team, release, artifact_root, model_cache, source, message
):
    version = make_version(
        make_model(team, "scorer"), artifact_root, backend=Backend.PYTHON, engine_args={},
        io_spec=IO_SPEC, api_surface=ApiSurface.GRPC,
    )  # fmt: skip
    weights_dir(version).mkdir(parents=True)
    (weights_dir(version) / "model.py").write_text(source)
    materialized(version)
    package_version(version)
    assert version.state == VersionState.FAILED
    assert message in version.failure_reason
    assert not (model_cache / "packages").exists()  # no partial package left behind


def test_engine_arg_dropped_from_the_release_fails_packaging(team, release, artifact_root):
    version = make_version(make_model(team), artifact_root, engine_args={"max_num_seqs": 8})
    release.allowed_engine_args = [a for a in release.allowed_engine_args if a != "max_num_seqs"]
    release.save()
    version.refresh_from_db()
    materialized(version)
    package_version(version)
    assert version.state == VersionState.FAILED
    assert "max_num_seqs" in version.failure_reason


def test_package_version_is_idempotent(team, release, artifact_root):
    version = materialized(make_version(make_model(team), artifact_root))
    package_version(version)
    assert version.state == VersionState.READY
    digest = version.package_digest
    assert len(digest) == 64 and version.package_manifest["version"] == version.number
    assert [(e.from_state, e.to_state) for e in version.events.all()][-2:] == [
        ("materialized", "packaging"),
        ("packaging", "ready"),
    ]
    assert version.events.last().message == f"Package sha256:{digest} stored."
    events = version.events.count()
    package_version(version)  # ready: nothing happens
    assert version.events.count() == events
    assert (version.state, version.package_digest) == (VersionState.READY, digest)


def test_interrupted_packaging_is_resumed(team, release, artifact_root):
    version = materialized(make_version(make_model(team), artifact_root))
    transition_version(version, VersionState.PACKAGING)  # a worker died here
    assert package_version(version).state == VersionState.READY


def test_only_materialized_versions_are_packaged(team, release, artifact_root):
    version = make_version(make_model(team), artifact_root)
    with pytest.raises(PackagingError, match="only materialized versions"):
        package_version(version)
    version.refresh_from_db()
    assert version.state == VersionState.REGISTERED


def test_registration_materializes_and_packages_through_a_real_worker(
    worker_cache, celery_worker_process, team, release, artifact_root
):
    source = artifact_root / "ranker"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}')
    (source / "model.safetensors").write_bytes(b"\0" * 4096)
    version = make_version(make_model(team), artifact_root)  # enqueues the copy on commit
    deadline = time.monotonic() + 60
    while version.state not in (VersionState.READY, VersionState.FAILED):
        assert time.monotonic() < deadline, f"stuck in {version.state}"
        time.sleep(0.2)
        version.refresh_from_db()
    assert version.state == VersionState.READY, version.failure_reason
    assert [(e.from_state, e.to_state) for e in version.events.all()] == [
        ("registered", "materializing"),
        ("materializing", "materialized"),
        ("materialized", "packaging"),
        ("packaging", "ready"),
    ]
    assert (weights_dir(version) / "model.safetensors").read_bytes() == b"\0" * 4096
    assert (worker_cache / "packages" / f"{version.package_digest}.tar").is_file()
    assert package_version_task.delay(version.pk).get(timeout=30) == "ready"
    assert package_version_task.delay(10**9).get(timeout=30) == "missing"
