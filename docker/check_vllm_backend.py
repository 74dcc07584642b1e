#!/usr/bin/env python3
"""Fail a serving-image build when Triton's vLLM backend, or the logits processors our packages
name, cannot import against the installed vLLM.

Triton's vllm backend is Python code compiled against one vLLM API surface; when the pair
drifts it fails at load time (Triton 25.09's backend imports ``vllm.engine.metrics``, which
newer vLLM removed). The backend itself cannot be imported outside a running Triton (it needs
``triton_python_backend_utils``), so this reads its source instead: every ``import vllm...`` and
``from vllm... import name`` in the backend must resolve in the installed vLLM.

The packager writes the constraint processor into every model.json's ``logits_processors``
list by qualified name (``module:Class``); vLLM imports it only when the engine starts, so a
name that does not resolve would fail every model load on a GPU. ``--model-json`` loads each
name with the serving package's own loader (:func:`serving.instance.plugins.load_class`, the
one the instance's start-up check uses) and requires a subclass of vLLM's ``LogitsProcessor``.
That mode runs after the image has installed the serving package; the backend mode runs
before it, so the serving package is imported only in the mode that needs it.

Usage: check_vllm_backend.py /opt/tritonserver/backends/vllm | --model-json model.json
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path


def vllm_imports(backend_dir: Path) -> list[tuple[str, str, str | None]]:
    """``(file, module, name or None)`` for every import of vLLM in the backend's sources."""
    found = []
    for path in sorted(backend_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(str(path), a.name, None) for a in node.names if _is_vllm(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_vllm(node.module):
                found += [(str(path), node.module, a.name) for a in node.names]  # type: ignore[misc]
    return found


def _is_vllm(module: str | None) -> bool:
    return module is not None and (module == "vllm" or module.startswith("vllm."))


def unresolved(imports: list[tuple[str, str, str | None]]) -> list[str]:
    problems = []
    for path, module_name, name in imports:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            problems.append(f"{path}: import {module_name}: {exc}")
            continue
        if name is None or name == "*" or hasattr(module, name):
            continue
        try:
            importlib.import_module(f"{module_name}.{name}")
        except ImportError:
            problems.append(f"{path}: from {module_name} import {name}: no such name")
    return problems


def logits_processor_problems(model_json: dict) -> list[str]:
    """Why each ``logits_processors`` entry of ``model_json`` would not load in vLLM (none: ok)."""
    names = model_json.get("logits_processors")
    if not isinstance(names, list) or not names:
        return ["model.json names no logits_processors: the constraint processor would not run"]
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
    except ImportError as exc:
        return [f"vLLM's LogitsProcessor interface does not import: {exc}"]
    from serving.instance.plugins import load_class

    problems = []
    for name in names:
        try:
            cls = load_class(name)
        except (ImportError, AttributeError, ValueError, TypeError) as exc:
            problems.append(f"logits processor {name!r}: {exc}")
            continue
        if not issubclass(cls, LogitsProcessor):
            problems.append(
                f"logits processor {name!r}: {cls.__qualname__} is not a subclass of vLLM's "
                "LogitsProcessor"
            )
    return problems


def check_model_json(path: Path) -> int:
    problems = logits_processor_problems(json.loads(path.read_text()))
    for problem in problems:
        print(f"{path}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"ok: the logits processors {path} names load against vLLM")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--model-json" and Path(argv[2]).is_file():
        return check_model_json(Path(argv[2]))
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    imports = vllm_imports(Path(argv[1]))
    if not imports:
        print(f"no vLLM imports found under {argv[1]}: is this the vllm backend?", file=sys.stderr)
        return 1
    problems = unresolved(imports)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(
            "Triton's vLLM backend does not match the installed vLLM; pin a compatible pair.",
            file=sys.stderr,
        )
        return 1
    print(f"ok: {len(imports)} vLLM imports of the backend resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
