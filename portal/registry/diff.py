"""What changes between two versions of a model, field by field, for the deploy form: the
serving version against the one about to replace it (Argo Rollouts and SageMaker show the same
before a rollout). Interface changes, the ones callers notice, are marked."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from portal.registry.display import engine_arg_items
from portal.registry.models import ModelVersion


@dataclass(frozen=True)
class Change:
    what: str
    before: str
    after: str
    #: Callers would notice it (backend, API surface, tool calls, I/O).
    interface: bool = False


def _text(value: Any) -> str:
    if value in (None, "", [], {}):
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _tensors(io_spec: dict[str, Any], side: str) -> dict[str, str]:
    return {
        t["name"]: f"{t.get('data_type', '?').removeprefix('TYPE_')} {t.get('dims', [])}"
        for t in (io_spec or {}).get(side, [])
    }


def _engine_args(old: ModelVersion, new: ModelVersion) -> list[Change]:
    before, after = dict(engine_arg_items(old.engine_args)), dict(engine_arg_items(new.engine_args))
    return [
        Change(f"engine argument {name}", before.get(name, "—"), after.get(name, "—"))
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    ]


def _io(old: ModelVersion, new: ModelVersion) -> list[Change]:
    changes = []
    for side in ("inputs", "outputs"):
        before, after = _tensors(old.io_spec, side), _tensors(new.io_spec, side)
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                changes.append(
                    Change(
                        f"{side[:-1]} {name}",
                        before.get(name, "—"),
                        after.get(name, "—"),
                        interface=True,
                    )
                )
    batch_before = (old.io_spec or {}).get("max_batch_size")
    batch_after = (new.io_spec or {}).get("max_batch_size")
    if batch_before != batch_after:
        changes.append(
            Change("max batch size", _text(batch_before), _text(batch_after), interface=True)
        )
    return changes


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12] if text else "—"


def version_diff(old: ModelVersion, new: ModelVersion) -> list[Change]:
    """Every difference a person deploying ``new`` in place of ``old`` should see; empty when
    the two would serve identically (the same source, settings and release)."""
    changes: list[Change] = []

    def compare(what: str, before: Any, after: Any, *, interface: bool = False) -> None:
        if before != after:
            changes.append(Change(what, _text(before), _text(after), interface))

    compare("backend", old.backend, new.backend, interface=True)
    compare("API surface", old.api_surface, new.api_surface, interface=True)
    compare("tool-call parser", old.tool_call_parser, new.tool_call_parser, interface=True)
    changes += _io(old, new)
    compare("artifact source", old.artifact_uri, new.artifact_uri)
    changes += _engine_args(old, new)
    compare("constraint plugins", old.constraint_plugins, new.constraint_plugins)
    if old.python_model != new.python_model:
        changes.append(
            Change("model.py (sha256)", _digest(old.python_model), _digest(new.python_model))
        )
    compare("platform release", old.release.name, new.release.name)
    return changes
