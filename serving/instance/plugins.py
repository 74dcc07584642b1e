"""Checking, before the engine starts, that the constraint plugins a package needs will load.

vLLM runs a logits processor that its ``logits_processors`` engine argument names by qualified
class name (``module:Class``); the packager writes the platform's constraint processor into
every vLLM model.json that way (:func:`serving.package.vllm_repository_files`), and that name
is the only way the processor is loaded: the project registers no entry point. vLLM imports
the named class only while the model loads, inside the engine. A package names the platform
plugins it needs (manifest ``constraint_plugins``); importing each one's class here, the way
vLLM will, turns a missing or broken plugin into a clear start-up refusal instead of an
engine that fails to load the model.

Where vLLM is not installed (the CPU engine's setup: ``./dev run``, local instances) the class
cannot be imported, since it subclasses vLLM's ``LogitsProcessor``, and nothing would run it:
the CPU engine applies the platform's constraints itself (:mod:`serving.engine.constraints`).
The step then checks only that every plugin the package names is known.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field

from serving.constraints import LOGITS_PROCESSOR

# THE mapping from a plugin name as the portal writes it into a package manifest
# (``constraint_plugins``) to the logits processor a model.json names for it.
PLATFORM_PLUGINS: dict[str, str] = {
    "platform-constraints": LOGITS_PROCESSOR,
}


class PluginError(RuntimeError):
    """A plugin the package needs is unknown, or its class does not load."""


@dataclass
class InstalledPlugins:
    logits_processors: list[str] = field(default_factory=list)  # qualified class names
    loaded: bool = True  # False: vLLM is not installed; the names were only checked


def install_plugins(names: list[str]) -> InstalledPlugins:
    """The logits processors ``names`` stand for, each imported as vLLM imports a named one.

    Raises :class:`PluginError` for a name the platform does not know and, where vLLM is
    installed, for a class that does not import or is not a vLLM ``LogitsProcessor``."""
    processors: list[str] = []
    for name in names:
        if name not in PLATFORM_PLUGINS:
            raise PluginError(
                f"constraint_plugins names unknown plugin {name!r}; known: {sorted(PLATFORM_PLUGINS)}"
            )
        processors.append(PLATFORM_PLUGINS[name])
    if importlib.util.find_spec("vllm") is None:
        return InstalledPlugins(logits_processors=processors, loaded=False)
    from vllm.v1.sample.logits_processor import LogitsProcessor

    for qualified in processors:
        try:
            cls = load_class(qualified)
        except Exception as exc:
            raise PluginError(
                f"logits processor {qualified} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        if not issubclass(cls, LogitsProcessor):
            raise PluginError(
                f"logits processor {qualified} is not a subclass of vLLM's LogitsProcessor"
            )
    return InstalledPlugins(logits_processors=processors)


def load_class(qualified: str) -> type:
    """The class ``module:Class`` names, found the way vLLM 0.24 resolves a named logits
    processor: import the module, then walk the dotted name after the colon.

    The serving image's build check (``docker/check_vllm_backend.py --model-json``) loads the
    names a packaged model.json holds with this too, so a name is checked as text first."""
    if not isinstance(qualified, str) or qualified.count(":") != 1:
        raise ValueError("must be a qualified name 'package.module:Class'")
    module_name, qualname = qualified.split(":")
    obj: object = importlib.import_module(module_name)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    if not isinstance(obj, type):
        raise TypeError(f"{qualified} is not a class")
    return obj
