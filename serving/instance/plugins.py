"""Installing a package's vLLM plugins through Python entry points, as vLLM itself does.

vLLM loads every ``vllm.logits_processors`` entry point at start-up and loads *and calls* every
``vllm.general_plugins`` one, both filtered by ``VLLM_PLUGINS`` (comma-separated names) when
set. A package names the platform plugins it needs (manifest ``constraint_plugins``); doing the
same loading here, before the engine starts, turns a missing or broken plugin into a clear
start-up failure instead of a request that is silently served unconstrained.

Where vLLM is not installed (the CPU engine's setup: ``./dev run``, local instances) the
plugins cannot be loaded, since they subclass vLLM's classes, and nothing would run them: the
CPU engine applies the platform's constraints itself (:mod:`serving.engine.constraints`). The
step then checks only that every plugin the package names is known, registered and allowed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

logger = logging.getLogger(__name__)

LOGITS_PROCESSORS_GROUP = "vllm.logits_processors"
GENERAL_PLUGINS_GROUP = "vllm.general_plugins"

# THE mapping from a plugin name as the portal writes it into a package manifest
# (``constraint_plugins``) to the entry point that provides it (group, entry-point name).
PLATFORM_PLUGINS: dict[str, tuple[str, str]] = {
    "platform-constraints": (LOGITS_PROCESSORS_GROUP, "constraint"),
}


class PluginError(RuntimeError):
    """A plugin the package needs is unknown, not installed, filtered out or broken."""


@dataclass
class InstalledPlugins:
    logits_processors: list[str] = field(default_factory=list)
    general_plugins: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # not needed by the package, so not fatal
    loaded: bool = True  # False: vLLM is not installed; required plugins were only checked


def allowed_plugins() -> list[str] | None:
    """``VLLM_PLUGINS`` as vLLM reads it (``None``: every plugin)."""
    value = os.environ.get("VLLM_PLUGINS")
    return None if value is None else value.split(",")


def required_entry_points(names: list[str], allowed: list[str] | None) -> set[tuple[str, str]]:
    """``(group, name)`` of every plugin ``names`` asks for; raises :class:`PluginError` for a
    name the platform does not know, one not installed, or one ``VLLM_PLUGINS`` excludes."""
    required: set[tuple[str, str]] = set()
    for name in names:
        if name not in PLATFORM_PLUGINS:
            raise PluginError(
                f"constraint_plugins names unknown plugin {name!r}; known: {sorted(PLATFORM_PLUGINS)}"
            )
        group, ep_name = PLATFORM_PLUGINS[name]
        if not entry_points(group=group, name=ep_name):
            raise PluginError(
                f"plugin {name!r} is not installed: no entry point {ep_name!r} in group {group!r}"
            )
        if allowed is not None and ep_name not in allowed:
            raise PluginError(
                f"plugin {name!r} ({ep_name!r}) is excluded by VLLM_PLUGINS={allowed}"
            )
        required.add((group, ep_name))
    return required


def install_plugins(names: list[str]) -> InstalledPlugins:
    """Load every logits-processor plugin and load and call every general plugin.

    A plugin the package names must load (and, for general plugins, run) or this raises
    :class:`PluginError`; any other plugin that fails is logged and skipped, as vLLM does."""
    allowed = allowed_plugins()
    required = required_entry_points(names, allowed)
    if importlib.util.find_spec("vllm") is None:
        return InstalledPlugins(
            logits_processors=sorted(n for g, n in required if g == LOGITS_PROCESSORS_GROUP),
            general_plugins=sorted(n for g, n in required if g == GENERAL_PLUGINS_GROUP),
            loaded=False,
        )
    installed = InstalledPlugins()
    for group, call in ((LOGITS_PROCESSORS_GROUP, False), (GENERAL_PLUGINS_GROUP, True)):
        for ep in entry_points(group=group):
            if allowed is not None and ep.name not in allowed:
                continue
            try:
                _load(ep, call)
            except Exception as exc:
                if (group, ep.name) in required:
                    raise PluginError(
                        f"plugin {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
                    ) from exc
                logger.warning("plugin %s (%s) failed to load: %s", ep.name, ep.value, exc)
                installed.failed.append(ep.name)
                continue
            target = installed.general_plugins if call else installed.logits_processors
            target.append(ep.name)
    return installed


def _load(ep: EntryPoint, call: bool) -> None:
    loaded = ep.load()
    if call:
        loaded()
