"""The plugin step in-process: what it loads where vLLM is installed, and what it checks where
it is not (the CPU engine's own setup)."""

from __future__ import annotations

import importlib.util

import pytest

from serving.instance import plugins
from serving.instance.plugins import PluginError, install_plugins


def test_with_vllm_the_constraint_processor_is_loaded(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    installed = install_plugins(["platform-constraints"])
    assert installed.loaded
    assert "constraint" in installed.logits_processors


def test_without_vllm_required_plugins_are_checked_not_loaded(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        plugins.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a),
    )
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    installed = install_plugins(["platform-constraints"])
    assert not installed.loaded
    assert installed.logits_processors == ["constraint"]
    assert installed.general_plugins == [] and installed.failed == []
    # Still refused: an unknown name, or one VLLM_PLUGINS leaves out.
    with pytest.raises(PluginError, match="unknown plugin"):
        install_plugins(["no-such-plugin"])
    monkeypatch.setenv("VLLM_PLUGINS", "something-else")
    with pytest.raises(PluginError, match="excluded by VLLM_PLUGINS"):
        install_plugins(["platform-constraints"])
