"""The plugin step in-process: what it imports where vLLM is installed, and what it checks where
it is not (the CPU engine's own setup)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from serving.constraints import LOGITS_PROCESSOR
from serving.instance import plugins
from serving.instance.plugins import PluginError, install_plugins


def without_vllm(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        plugins.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a),
    )


def test_with_vllm_the_constraint_processor_is_imported():
    pytest.importorskip("vllm")
    installed = install_plugins(["platform-constraints"])
    assert installed.loaded
    assert installed.logits_processors == [LOGITS_PROCESSOR]
    assert "serving.constraints.vllm_v1" in sys.modules


def test_with_vllm_a_processor_that_does_not_load_is_refused(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setitem(plugins.PLATFORM_PLUGINS, "missing", "serving.constraints:NoSuchClass")
    with pytest.raises(PluginError, match="NoSuchClass failed to load: AttributeError"):
        install_plugins(["missing"])
    monkeypatch.setitem(plugins.PLATFORM_PLUGINS, "not-vllms", "json:JSONDecoder")
    with pytest.raises(PluginError, match="not a subclass of vLLM's LogitsProcessor"):
        install_plugins(["not-vllms"])


def test_without_vllm_plugins_are_checked_not_imported(monkeypatch):
    without_vllm(monkeypatch)
    installed = install_plugins(["platform-constraints"])
    assert not installed.loaded
    assert installed.logits_processors == [LOGITS_PROCESSOR]
    assert install_plugins([]).logits_processors == []
    # Still refused: a name the platform does not know.
    with pytest.raises(PluginError, match="unknown plugin 'no-such-plugin'"):
        install_plugins(["no-such-plugin"])
