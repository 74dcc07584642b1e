"""The plugin check's child process: load a package's plugins exactly as the engine will.

    python -m serving.instance.plugin_check SPEC.json RESULT.json

Run by :func:`serving.instance.plugins.install_plugins` with the environment the engine gets
(``PYTHONPATH`` starting with the instance's plugin directory, ``VLLM_PLUGINS`` set to the
declared general plugins), so it imports what the engine will import, and a plugin's import
side effects stay out of the supervisor. ``SPEC.json``::

    {"general_plugins": [{"plugin": dist, "version": v, "entry_point": name, "value": "m:f"}],
     "logits_processors": [same shape, "value": "module:Class"],
     "named_processors": ["module:Class", ...]}   # model.json's logits_processors, in order

Where vLLM imports, its own loaders do the work: ``vllm.plugins.load_plugins_by_group`` for the
general plugins (every declared name must come back: vLLM logs and swallows a failing import),
each plugin function called as ``load_general_plugins`` calls it, with what it registered in
``vllm.ModelRegistry`` recorded (a name two plugins register, or one vLLM already has, is
refused), then ``_load_logitsprocs_by_fqcns`` for each named processor (import and the
``LogitsProcessor`` base class) and ``_load_logitsprocs_plugins`` (what vLLM loads regardless of
``VLLM_PLUGINS``). Where it does not, each declared entry point is only imported. ``RESULT.json``
gets ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}`` naming the plugin and entry point.
Nothing is written on stdout: a plugin may print there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import logging
import sys
import traceback
from typing import Any


class Refused(Exception):
    pass


def _what(entry: dict[str, Any], group: str) -> str:
    return (
        f"plugin {entry['plugin']} {entry['version']}: {group} entry point "
        f"{entry['entry_point']} = {entry['value']}"
    )


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Captured(logging.Handler):
    """vLLM's ``load_plugins_by_group`` logs a failing import and goes on: keep the error."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.errors: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if (
            isinstance(record.args, tuple)
            and record.args
            and record.exc_info
            and record.exc_info[1]
        ):
            self.errors[str(record.args[0])] = _error(record.exc_info[1])


def _registry_models() -> dict[str, Any]:
    from vllm import ModelRegistry

    models = getattr(ModelRegistry, "models", None)
    if isinstance(models, dict):
        return dict(models)
    return dict.fromkeys(ModelRegistry.get_supported_archs())


def check_with_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.v1.sample.logits_processor import (
        _load_logitsprocs_by_fqcns,
        _load_logitsprocs_plugins,
    )

    declared = {entry["entry_point"]: entry for entry in spec["general_plugins"]}
    captured = _Captured()
    plugin_logger = logging.getLogger("vllm.plugins")
    plugin_logger.addHandler(captured)
    try:
        loaded = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    finally:
        plugin_logger.removeHandler(captured)
    for name, entry in declared.items():
        if name not in loaded:
            reason = captured.errors.get(name, "vLLM did not find it among installed entry points")
            raise Refused(f"{_what(entry, DEFAULT_PLUGINS_GROUP)} did not load: {reason}")
    if unexpected := sorted(set(loaded) - set(declared)):
        raise Refused(f"vLLM loaded general plugins the package does not declare: {unexpected}")

    # Called in the order vLLM's load_general_plugins calls them; what each registers is kept.
    registered: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for name, func in loaded.items():
        entry = declared[name]
        before = _registry_models()
        try:
            func()
        except Exception as exc:
            raise Refused(f"{_what(entry, DEFAULT_PLUGINS_GROUP)} raised {_error(exc)}") from exc
        after = _registry_models()
        changed = sorted(k for k, v in after.items() if k not in before or before[k] is not v)
        for arch in changed:
            if arch in owner:
                raise Refused(
                    f"{_what(entry, DEFAULT_PLUGINS_GROUP)} registers architecture {arch!r}, "
                    f"which general plugin {owner[arch]} already registered"
                )
            if arch in before:
                raise Refused(
                    f"{_what(entry, DEFAULT_PLUGINS_GROUP)} re-registers architecture {arch!r}, "
                    "which vLLM already has"
                )
            owner[arch] = name
        registered[name] = changed

    by_value = {entry["value"]: entry for entry in spec["logits_processors"]}
    for qualified in spec["named_processors"]:
        entry = by_value.get(qualified)
        what = _what(entry, "vllm.logits_processors") if entry else f"logits processor {qualified}"
        try:
            _load_logitsprocs_by_fqcns([qualified])
        except Exception as exc:
            cause = f" ({_error(exc.__cause__)})" if exc.__cause__ else ""
            raise Refused(f"{what} did not load: {_error(exc)}{cause}") from exc
    try:
        always = _load_logitsprocs_plugins()
    except Exception as exc:
        cause = f" ({_error(exc.__cause__)})" if exc.__cause__ else ""
        raise Refused(
            f"an installed vllm.logits_processors entry point did not load: {_error(exc)}{cause}"
        ) from exc
    return {
        "vllm": vllm.__version__,
        "general_plugins": list(loaded),
        "registered": registered,
        "logits_processors": spec["named_processors"],
        # Entry points vLLM loads whatever VLLM_PLUGINS says (the image's, not the package's).
        "entry_point_logits_processors": [f"{c.__module__}:{c.__qualname__}" for c in always],
    }


def check_without_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    """No vLLM to load them: import each declared entry point's target, call nothing."""
    for group, key in (("vllm.general_plugins", "general_plugins"),
                       ("vllm.logits_processors", "logits_processors")):  # fmt: skip
        for entry in spec[key]:
            point = importlib.metadata.EntryPoint(entry["entry_point"], entry["value"], group)
            try:
                point.load()
            except Exception as exc:
                raise Refused(f"{_what(entry, group)} did not import: {_error(exc)}") from exc
    return {
        "vllm": None,
        "general_plugins": [e["entry_point"] for e in spec["general_plugins"]],
        "registered": {},
        "logits_processors": spec["named_processors"],
        "entry_point_logits_processors": [],
    }


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        if importlib.util.find_spec("vllm") is None:
            result = {"ok": True, **check_without_vllm(spec)}
        else:
            result = {"ok": True, **check_with_vllm(spec)}
    except Refused as exc:
        result = {"ok": False, "error": str(exc)}
    except Exception as exc:  # the check itself broke (vLLM does not import, ...)
        result = {"ok": False, "error": f"plugin check failed: {_error(exc)}"}
        traceback.print_exc()
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
