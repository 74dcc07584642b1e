"""The one reader of the Triton model repository (serving.repository), which the KServe server
and the OpenAI front end (serving.frontend.catalog) both use: which version is served, what is
refused, and that what the portal's writer (serving.package) writes reads back as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.frontend.catalog import read_catalog
from serving.package import vllm_repository_files
from serving.repository import PYTHON_BACKEND, RepositoryError, read_model, read_repository

VLLM_CONFIG = 'backend: "vllm"\n'


def _write(root: Path, files: dict[str, bytes | str]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def _vllm_model(root: Path, name: str, versions: list[str], config: str = VLLM_CONFIG) -> Path:
    files: dict[str, bytes | str] = {f"{name}/config.pbtxt": config}
    for version in versions:
        files[f"{name}/{version}/model.json"] = json.dumps({"model": f"weights-{version}"})
    return _write(root, files) / name


def test_what_the_writer_writes_reads_back(tmp_path) -> None:
    files = vllm_repository_files(
        "team--m", 5, "/weights", {"max_num_seqs": 4}, tool_call_parser="hermes"
    )
    root = _write(tmp_path, dict(files))
    [entry] = read_repository(root)
    assert (entry.name, entry.version, entry.backend) == ("team--m", "5", "vllm")
    assert entry.version_dir == root / "team--m" / "5"
    assert entry.engine_args()["max_num_seqs"] == 4
    model = read_catalog(root)["team--m"]
    assert (model.version, model.kind, model.tool_call_parser) == ("5", "generate", "hermes")
    assert model.tokenizer_path == Path("/weights")


def test_the_highest_version_directory_is_served_as_triton_numbers_them(tmp_path) -> None:
    # Numeric order, not text order; names starting with "0" and non-numbers are not versions.
    model_dir = _vllm_model(tmp_path, "m", ["1", "2", "10", "012", "0", "latest"])
    assert read_model(model_dir).version == "10"
    assert read_catalog(tmp_path)["m"].version == "10"


def test_a_specific_version_policy_is_honoured(tmp_path) -> None:
    config = VLLM_CONFIG + "version_policy { specific { versions: [1, 2] } }\n"
    model_dir = _vllm_model(tmp_path, "m", ["1", "2", "3"], config)
    entry = read_model(model_dir)
    assert (entry.version, entry.engine_args()["model"]) == ("2", "weights-2")
    assert read_catalog(tmp_path)["m"].version == "2"


def test_a_version_the_policy_names_must_exist(tmp_path) -> None:
    config = VLLM_CONFIG + "version_policy { specific { versions: 4 } }\n"
    model_dir = _vllm_model(tmp_path, "m", ["1"], config)
    with pytest.raises(RepositoryError, match=r"version directory .*4 is missing"):
        read_model(model_dir)


def test_a_served_version_without_engine_arguments_is_refused_not_skipped(tmp_path) -> None:
    model_dir = _vllm_model(tmp_path, "m", ["1"])
    (model_dir / "2").mkdir()  # the newest version, without model.json
    with pytest.raises(RepositoryError, match=r"2: model\.json .* is missing"):
        read_model(model_dir)
    with pytest.raises(RepositoryError, match=r"model\.json .* is missing"):
        read_catalog(tmp_path)


def test_the_front_end_lists_the_vllm_models_only(tmp_path) -> None:
    _vllm_model(tmp_path, "generative", ["1"])
    _write(
        tmp_path,
        {
            "python_model/config.pbtxt": 'backend: "python"\n'
            "version_policy { specific { versions: 3 } }\n",
            "python_model/3/model.py": "",
            "python_model/7/model.py": "",
        },
    )
    entries = {e.name: e for e in read_repository(tmp_path)}
    assert entries["python_model"].backend == PYTHON_BACKEND
    assert entries["python_model"].version == "3"
    assert list(read_catalog(tmp_path)) == ["generative"]


def test_an_empty_repository_is_refused(tmp_path) -> None:
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(RepositoryError, match="holds no model"):
        read_repository(tmp_path)
    with pytest.raises(RepositoryError, match="holds no model"):
        read_catalog(tmp_path)


def test_the_catalog_reads_kind_and_tokenizer_from_the_engine_arguments(tmp_path) -> None:
    args = {"model": "weights", "tokenizer": "tok", "runner": "pooling"}
    _write(tmp_path, {"e/config.pbtxt": VLLM_CONFIG, "e/1/model.json": json.dumps(args)})
    model = read_catalog(tmp_path)["e"]
    assert model.kind == "embed" and model.tool_call_parser is None
    assert model.tokenizer_path == tmp_path / "e" / "1" / "tok"  # relative to the version


@pytest.mark.parametrize(
    ("config", "size"),
    [
        ({"vocab_size": 32000}, 32000),
        ({"text_config": {"vocab_size": 151936}}, 151936),  # a wrapped language model
        ({}, None),
        (None, None),  # no config.json next to the weights: the engine checks token ids
    ],
)
def test_the_catalog_reads_the_vocabulary_size_vllm_checks_token_ids_against(
    tmp_path, config, size
) -> None:
    files = {"m/config.pbtxt": VLLM_CONFIG, "m/1/model.json": json.dumps({"model": "w"})}
    if config is not None:
        files["m/1/w/config.json"] = json.dumps(config)
    _write(tmp_path, files)
    assert read_catalog(tmp_path)["m"].vocab_size == size


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"m/1/model.json": "{"}, r"model\.json: Expecting"),
        ({"m/1/model.json": '{"tokenizer": "t"}'}, "need a 'model' string"),
        (
            {
                "m/config.pbtxt": VLLM_CONFIG + 'parameters { key: "tool_call_parser" '
                'value { string_value: "nope" } }\n'
            },
            r"config\.pbtxt: .*nope",
        ),
    ],
)
def test_the_catalog_refuses_what_it_cannot_read(tmp_path, files, message) -> None:
    _vllm_model(tmp_path, "m", ["1"])
    _write(tmp_path, files)
    with pytest.raises(RepositoryError, match=message):
        read_catalog(tmp_path)
