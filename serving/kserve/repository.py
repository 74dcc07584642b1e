"""Read a Triton model repository laid out for the vLLM backend.

``<repo>/<name>/config.pbtxt`` (a ``ModelConfig`` in protobuf text) and
``<repo>/<name>/<version>/model.json``. Triton's default version policy serves the latest
numeric version; the configuration is auto-completed as the vLLM backend does, and the checks
the backend makes at load (``backend: "vllm"``, a decoupled policy) are made here too, so a
repository that Triton would refuse is refused before any port opens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.kserve.contract import BACKEND, auto_complete


class RepositoryError(RuntimeError):
    """The repository (or one model in it) cannot be served; the message says which and why."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    version: str
    version_dir: Path
    config: mc.ModelConfig


def read_config(model_dir: Path) -> mc.ModelConfig:
    path = model_dir / "config.pbtxt"
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except FileNotFoundError:
        raise RepositoryError(f"{path} is missing") from None
    except text_format.ParseError as exc:
        raise RepositoryError(f"{path} is not a valid model configuration: {exc}") from None
    if config.name and config.name != model_dir.name:
        raise RepositoryError(
            f"{path}: model name '{config.name}' does not match its directory '{model_dir.name}'"
        )
    config.name = model_dir.name
    if config.backend != BACKEND:
        raise RepositoryError(
            f"{path}: backend '{config.backend}' is not served here; only '{BACKEND}' is"
        )
    if config.HasField("model_transaction_policy") and not (
        config.model_transaction_policy.decoupled
    ):
        raise RepositoryError(
            f"{path}: the vLLM backend must be configured to use decoupled model transaction policy"
        )
    if config.max_batch_size not in (0,):
        raise RepositoryError(f"{path}: max_batch_size must be 0 (vLLM batches on its own)")
    auto_complete(config)
    if not config.instance_group:
        config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_MODEL)
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    return config


def read_model(model_dir: Path) -> ModelEntry:
    config = read_config(model_dir)
    versions = sorted(
        (int(p.name), p) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()
    )
    if not versions:
        raise RepositoryError(f"{model_dir}: no numeric version directory")
    number, version_dir = versions[-1]
    if not (version_dir / "model.json").is_file():
        raise RepositoryError(f"{version_dir}: model.json (the vLLM engine arguments) is missing")
    return ModelEntry(config.name, str(number), version_dir, config)


def read_repository(root: Path, names: list[str] | None = None) -> list[ModelEntry]:
    """Every model of ``root`` (or only ``names``, which may be none), sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a directory")
    if names is not None:
        missing = [n for n in names if not (root / n / "config.pbtxt").is_file()]
        if missing:
            raise RepositoryError(f"model repository {root} has no model(s) {missing}")
        dirs = [root / n for n in sorted(set(names))]
    else:
        dirs = sorted(p for p in root.iterdir() if (p / "config.pbtxt").is_file())
        if not dirs:
            raise RepositoryError(f"model repository {root} holds no model (no */config.pbtxt)")
    return [read_model(d) for d in dirs]


def model_names(root: Path) -> list[str]:
    """Every model directory of the repository (one holding a ``config.pbtxt``), sorted."""
    return sorted(p.name for p in Path(root).iterdir() if (p / "config.pbtxt").is_file())


@dataclass(frozen=True)
class ModelControl:
    """Triton's model control (``--model-control-mode``) over one repository.

    ``explicit``: the repository-extension calls (load, unload) are allowed, as with
    ``--model-control-mode=explicit``; otherwise (``none``) they are refused as Triton refuses
    them. ``load`` turns an entry into a ready engine (slow: reads weights); it runs in a worker
    thread, so serving goes on while a model loads."""

    root: Path
    explicit: bool
    load: Callable[[ModelEntry], Any]
