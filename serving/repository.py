"""The Triton model repository, read back: the one reader beside its writer (:mod:`serving.package`).

Both servers of an instance read the repository through this module: the KServe server
(:mod:`serving.kserve`) to load and describe the models, and the OpenAI front end
(:mod:`serving.frontend.catalog`) to learn each model's tokenizer, kind and tool-call format.
So both agree on which models exist, which version of each is served, and what a model that
Triton would refuse looks like.

``<repo>/<name>/config.pbtxt`` (a ``ModelConfig`` in protobuf text) names the backend. A vLLM
model has ``<repo>/<name>/<version>/model.json`` (the engine arguments): its configuration is
auto-completed as the vLLM backend does, and the checks the backend makes at load
(``backend: "vllm"``, a decoupled policy) are made here too. A Python model has
``<version>/model.py``: here only what can be seen without running the author's code is
checked (the configuration parses, the version directory and ``model.py`` exist); its real
configuration comes from ``auto_complete_config`` when
:class:`~serving.python_backend.PythonModelHandle` loads it. A repository Triton would refuse is
refused before any port opens, and so is one that holds no model at all (an instance serves the
model of its package; an empty repository means the package is broken, and serving nothing
would hide that). The Python backend's own reader (:mod:`serving.python_backend.config`, which
a handle loads a model with) takes a model's name and served version from the rules here too.

Which version is served (one per model here), as Triton decides it:

* Version directories are the numerically named subdirectories; a name that starts with "0"
  (``0``, ``01``) or is not a number is ignored, as Triton ignores it.
* A ``specific`` version policy serves the version it names (the highest, when it names
  several). The portal writes one for every model it packages
  (:func:`serving.package.vllm_config`), so the served version is the packaged one even if
  another directory is present.
* Otherwise (``latest``, the default ``latest { num_versions: 1 }``, or ``all``) the highest
  version directory is served.
* The chosen version must hold the backend's file (``model.json``, or ``model.py`` /
  ``default_model_filename``); if it does not, the model is refused. Triton does not fall back
  to an older version when the newest cannot load, so neither does this reader.

Where the two readers this module replaces disagreed, this is what was decided: the front end
used to skip a version without ``model.json`` and serve an older one, and to ignore the
version policy; it now serves the same version the KServe server loads (the rules above), so
the front end never routes a model name to a version the engine does not have. The front end
used to accept a repository with no model; it is refused now, as the KServe server refused it.
Both used to take ``0``-prefixed directories as versions; Triton ignores them, and so does
this reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.model_config import BACKEND, auto_complete
from serving.package import CONFIG_FILE, ENGINE_ARGS_FILE

PYTHON_BACKEND = "python"
BACKENDS = (BACKEND, PYTHON_BACKEND)


class RepositoryError(RuntimeError):
    """The repository (or one model in it) cannot be served; the message says which and why."""


@dataclass(frozen=True)
class ModelEntry:
    """One model of the repository, at the version that is served."""

    name: str
    version: str
    version_dir: Path
    config: mc.ModelConfig
    backend: str = BACKEND

    @property
    def model_dir(self) -> Path:
        return self.version_dir.parent

    def engine_args(self) -> dict[str, Any]:
        """A vLLM model's engine arguments (``<version>/model.json``): an object with a
        ``model`` string. The engine that loads the model makes its own, stricter checks."""
        path = self.version_dir / ENGINE_ARGS_FILE
        try:
            args = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise RepositoryError(f"{path}: {exc}") from None
        if not isinstance(args, dict) or not isinstance(args.get("model"), str):
            raise RepositoryError(f"{path}: engine arguments need a 'model' string")
        return args


def read_config(model_dir: Path) -> mc.ModelConfig:
    """``<model_dir>/config.pbtxt``, checked and completed as Triton and the model's backend
    would at load."""
    path = model_dir / CONFIG_FILE
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except FileNotFoundError:
        raise RepositoryError(f"{path} is missing") from None
    except text_format.ParseError as exc:
        raise RepositoryError(f"{path} is not a valid model configuration: {exc}") from None
    take_directory_name(config, model_dir, path)
    if config.backend not in BACKENDS:
        raise RepositoryError(
            f"{path}: backend '{config.backend}' is not served here; only "
            f"{' and '.join(repr(b) for b in BACKENDS)} are"
        )
    if config.backend == PYTHON_BACKEND:
        return config
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


def take_directory_name(config: mc.ModelConfig, model_dir: Path, path: Path) -> None:
    """Name ``config`` after its model's directory, as Triton does: a configuration (read from
    ``path``) may leave the name out or repeat the directory's, nothing else."""
    if config.name and config.name != model_dir.name:
        raise RepositoryError(
            f"{path}: model name '{config.name}' does not match its directory '{model_dir.name}'"
        )
    config.name = model_dir.name


def version_numbers(model_dir: Path) -> list[int]:
    """The model's versions, ascending: its numerically named subdirectories, less those whose
    name starts with "0" (Triton ignores both those and names that are not numbers)."""
    return sorted(
        int(p.name)
        for p in model_dir.iterdir()
        if p.is_dir() and p.name.isascii() and p.name.isdigit() and not p.name.startswith("0")
    )


def served_version(model_dir: Path, config: mc.ModelConfig) -> int:
    """The version of ``model_dir`` that is served (see the module's rules): the one a
    ``specific`` policy names (the highest, when it names several), else the highest."""
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") == "specific" and policy.specific.versions:
        number = max(policy.specific.versions)
        if not (model_dir / str(number)).is_dir():
            raise RepositoryError(
                f"model '{config.name}': version directory {model_dir / str(number)} is missing "
                "(its version policy names that version)"
            )
        return number
    numbers = version_numbers(model_dir)
    if not numbers:
        raise RepositoryError(f"{model_dir}: no numeric version directory")
    return numbers[-1]


def read_model(model_dir: Path) -> ModelEntry:
    """The model of ``model_dir`` at its served version; :class:`RepositoryError` says why it
    cannot be served."""
    config = read_config(model_dir)
    version = str(served_version(model_dir, config))
    version_dir = model_dir / version
    if config.backend == PYTHON_BACKEND:
        python_model_file(version_dir, config)
        return ModelEntry(config.name, version, version_dir, config, PYTHON_BACKEND)
    if not (version_dir / ENGINE_ARGS_FILE).is_file():
        raise RepositoryError(
            f"{version_dir}: {ENGINE_ARGS_FILE} (the vLLM engine arguments) is missing"
        )
    return ModelEntry(config.name, version, version_dir, config)


def python_model_file(version_dir: Path, config: mc.ModelConfig) -> Path:
    """The file a Python model's version runs (``model.py``, or ``default_model_filename``),
    which must be there: Triton refuses the model otherwise."""
    path = version_dir / (config.default_model_filename or "model.py")
    if not path.is_file():
        raise RepositoryError(f"Python model file not found in '{path}'")
    return path


def model_names(root: Path) -> list[str]:
    """Every model directory of the repository (one holding a ``config.pbtxt``), sorted."""
    return sorted(p.name for p in Path(root).iterdir() if (p / CONFIG_FILE).is_file())


def read_repository(root: Path, names: list[str] | None = None) -> list[ModelEntry]:
    """Every model of ``root`` (or only ``names``, which may be none), sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a directory")
    if names is not None:
        missing = [n for n in names if not (root / n / CONFIG_FILE).is_file()]
        if missing:
            raise RepositoryError(f"model repository {root} has no model(s) {missing}")
        selected = sorted(set(names))
    else:
        selected = model_names(root)
        if not selected:
            raise RepositoryError(f"model repository {root} holds no model (no */{CONFIG_FILE})")
    return [read_model(root / name) for name in selected]
