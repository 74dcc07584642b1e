"""The plugin step's parts in-process: the manifest's plugins checked, the install (what it
refuses, the entry points it drops, the engine's environment), vLLM 0.24's ``VLLM_PLUGINS``, and
the check's loading where vLLM is installed and where it is not (the CPU engine's own setup).
The step as a real process: ``test_instance_author_plugins.py``."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest

from serving.constraints import LOGITS_PROCESSOR
from serving.instance import plugin_check, plugins
from serving.instance.plugins import (
    PluginError,
    author_plugins,
    install_plugins,
    plugin_environment,
    prepare_plugins,
)
from serving.package import extract_package
from tests.plugin_wheels import make_wheel
from tests.serving.instance_helpers import build_package, build_plugin_package, plugin_entry

HELLO = {"hello_plugin/__init__.py": "def register():\n    pass\n"}


def without_vllm(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        plugins.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a),
    )


def unpacked(tmp_path: Path, package: Path) -> tuple[dict, Path]:
    repository = tmp_path / "work" / "repository"
    return extract_package(package, repository), repository


def hello_package(tmp_path: Path, **wheel_overrides) -> Path:
    options = {
        "entry_points": {"vllm.general_plugins": {"hello": "hello_plugin:register"}},
        "files": HELLO,
        **wheel_overrides,
    }
    wheel = make_wheel(tmp_path / "wheels", "hello-plugin", **options)
    entry = plugin_entry(wheel, "hello-plugin", general_plugins={"hello": "hello_plugin:register"})
    return build_plugin_package(tmp_path / "pkg.tar", tmp_path / "weights", [entry])


# --- where vLLM is installed: vLLM's own loaders, in this process -----------------------------


def test_vllm_plugins_empty_loads_no_general_plugin(monkeypatch):
    """vLLM 0.24 splits ``VLLM_PLUGINS`` on commas: ``""`` is ``[""]``, which no entry point
    name matches; unset loads every installed one (vLLM ships two LoRA resolver plugins)."""
    pytest.importorskip("vllm")
    from vllm.plugins import load_plugins_by_group

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert "lora_filesystem_resolver" in load_plugins_by_group("vllm.general_plugins")
    monkeypatch.setenv("VLLM_PLUGINS", "")
    assert load_plugins_by_group("vllm.general_plugins") == {}


def test_with_vllm_the_constraint_processor_is_loaded(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_PLUGINS", "")
    spec = {"general_plugins": [], "logits_processors": [], "named_processors": [LOGITS_PROCESSOR]}
    result = plugin_check.check_with_vllm(spec)
    assert result["logits_processors"] == [LOGITS_PROCESSOR]
    assert result["general_plugins"] == [] and result["registered"] == {}
    assert "serving.constraints.vllm_v1" in sys.modules


def test_with_vllm_a_processor_that_does_not_load_is_refused(monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_PLUGINS", "")
    spec = {"general_plugins": [], "logits_processors": []}
    missing = {**spec, "named_processors": ["serving.constraints:NoSuchClass"]}
    with pytest.raises(plugin_check.Refused, match="NoSuchClass did not load: AttributeError"):
        plugin_check.check_with_vllm(missing)
    not_vllms = {**spec, "named_processors": ["json:JSONDecoder"]}
    with pytest.raises(plugin_check.Refused, match="must be a subclass of LogitsProcessor"):
        plugin_check.check_with_vllm(not_vllms)


# --- where it is not: names checked, entry points imported -----------------------------------


def test_without_vllm_platform_plugins_are_checked_not_imported(monkeypatch, tmp_path):
    without_vllm(monkeypatch)
    manifest, repository = unpacked(tmp_path, build_package(tmp_path / "p.tar", tmp_path / "w"))
    installed = install_plugins(manifest, repository, tmp_path / "work")
    assert not installed.loaded
    assert installed.logits_processors == [LOGITS_PROCESSOR]
    assert installed.info()["check"] == plugins.NOT_LOADED
    assert installed.env == {"VLLM_PLUGINS": ""}  # no wheels: PYTHONPATH untouched
    # Still refused: a name the platform does not know.
    with pytest.raises(PluginError, match="unknown plugin 'no-such-plugin'"):
        install_plugins(
            {**manifest, "constraint_plugins": ["no-such-plugin"]}, repository, tmp_path
        )


def test_the_cpu_engine_without_wheels_loads_nothing_with_vllm(tmp_path):
    """It applies the platform's constraints natively; vLLM would load nothing it runs."""
    manifest, repository = unpacked(tmp_path, build_package(tmp_path / "p.tar", tmp_path / "w"))
    installed, spec = prepare_plugins(manifest, repository, tmp_path / "work", engine="cpu")
    assert spec is None and not installed.loaded
    assert installed.info()["check"] == plugins.CPU_ENGINE_PLATFORM_ONLY
    assert installed.logits_processors == [LOGITS_PROCESSOR]
    with pytest.raises(PluginError, match="unknown plugin 'no-such-plugin'"):
        prepare_plugins(
            {**manifest, "constraint_plugins": ["no-such-plugin"]},
            repository,
            tmp_path,
            engine="cpu",
        )
    # The same package for tritonserver is loaded by vLLM's loaders, which vLLM will run.
    _, spec = prepare_plugins(manifest, repository, tmp_path / "work2")
    assert spec is not None and spec["named_processors"] == [LOGITS_PROCESSOR]


def test_without_vllm_entry_points_are_imported(monkeypatch, tmp_path):
    without_vllm(monkeypatch)
    manifest, repository = unpacked(tmp_path, hello_package(tmp_path))
    installed, spec = prepare_plugins(manifest, repository, tmp_path / "work")
    assert spec is not None and installed.general_plugins == ["hello"]
    monkeypatch.syspath_prepend(installed.env["PYTHONPATH"].split(":")[0])
    try:
        result = plugin_check.check_without_vllm(spec)
        assert "hello_plugin" in sys.modules
    finally:
        sys.modules.pop("hello_plugin", None)
    assert result["vllm"] is None and result["general_plugins"] == ["hello"]
    broken = {**spec, "general_plugins": [{**spec["general_plugins"][0], "value": "nope:f"}]}
    with pytest.raises(plugin_check.Refused, match="hello = nope:f did not import"):
        plugin_check.check_without_vllm(broken)


# --- the manifest and the install -------------------------------------------------------------


def test_the_install_is_fresh_and_the_engine_environment_names_it(tmp_path):
    manifest, repository = unpacked(tmp_path, hello_package(tmp_path))
    workdir = tmp_path / "work"
    (workdir / plugins.SITE_DIR / "left_over").mkdir(parents=True)
    base = {"PYTHONPATH": "/opt/extra"}
    info: dict = {}
    installed, _ = prepare_plugins(manifest, repository, workdir, base_env=base, progress=info)
    site = workdir / plugins.SITE_DIR
    assert not (site / "left_over").exists()
    assert (site / "hello_plugin" / "__init__.py").is_file()
    assert installed.env == {"VLLM_PLUGINS": "hello", "PYTHONPATH": f"{site}:/opt/extra"}
    assert info["installed"] == installed.installed == ["hello-plugin==1.0.0"]
    assert plugin_environment({}, None, []) == {"VLLM_PLUGINS": ""}
    assert plugin_environment({}, site, ["a", "b"]) == {
        "VLLM_PLUGINS": "a,b",
        "PYTHONPATH": str(site),
    }


def test_named_processor_entry_points_are_dropped_from_the_installed_copy(tmp_path):
    """vLLM 0.24 loads every installed ``vllm.logits_processors`` entry point and then the
    classes model.json names: the installed copy keeps only the general plugin entry point."""
    points = {
        "vllm.general_plugins": {"hello": "hello_plugin:register"},
        "vllm.logits_processors": {"proc": "hello_plugin:Proc"},
    }
    wheel = make_wheel(tmp_path / "wheels", "hello-plugin", entry_points=points, files=HELLO)
    entry = plugin_entry(
        wheel,
        "hello-plugin",
        general_plugins=points["vllm.general_plugins"],
        logits_processors=points["vllm.logits_processors"],
    )
    package = build_plugin_package(tmp_path / "pkg.tar", tmp_path / "weights", [entry])
    manifest, repository = unpacked(tmp_path, package)
    info: dict = {}
    installed, spec = prepare_plugins(manifest, repository, tmp_path / "work", progress=info)
    assert installed.logits_processors == [LOGITS_PROCESSOR, "hello_plugin:Proc"]
    assert info["entry_points_dropped"] == ["proc = hello_plugin:Proc"]
    (dist,) = importlib.metadata.distributions(path=[str(tmp_path / "work" / plugins.SITE_DIR)])
    assert [(e.group, e.name) for e in dist.entry_points] == [("vllm.general_plugins", "hello")]
    assert spec is not None and spec["named_processors"] == installed.logits_processors
    # Not named in model.json: refused (vLLM would run it only through its entry point).
    unnamed = build_plugin_package(
        tmp_path / "u.tar", tmp_path / "w", [entry], name_in_model_json=False
    )
    manifest, repository = unpacked(tmp_path / "u", unnamed)
    with pytest.raises(PluginError, match=r"does not name \['hello_plugin:Proc'\]"):
        prepare_plugins(manifest, repository, tmp_path / "u" / "work")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p.update(file="elsewhere/hello.whl"), "is not demo--tiny/plugins/<wheel>"),
        (lambda p: p.update(sha256="0" * 64), "not a package member with that sha256"),
        (lambda p: p.update(general_plugins={"a,b": "m:f"}), "'a,b' is not a plain name"),
        (lambda p: p.update(general_plugins={"hello": "not qualified"}), "is not module:attr"),
        (lambda p: p.update(name=""), "must be non-empty strings"),
    ],
)
def test_a_malformed_plugins_entry_is_refused(tmp_path, change, reason):
    manifest, _ = unpacked(tmp_path, hello_package(tmp_path))
    change(manifest["plugins"][0])
    with pytest.raises(PluginError, match=reason):
        author_plugins(manifest)


def test_two_plugins_declaring_one_entry_point_name_are_refused(tmp_path):
    manifest, _ = unpacked(tmp_path, hello_package(tmp_path))
    manifest["plugins"].append({**manifest["plugins"][0], "name": "other"})
    with pytest.raises(PluginError, match="'hello' is declared by both plugin hello-plugin and"):
        author_plugins(manifest)


@pytest.mark.parametrize(
    ("wheel", "reason"),
    [
        ({"version": "2.0.0"}, "hello-plugin 1.0.0: its wheel .* installed 2.0.0"),
        (
            {"entry_points": {"vllm.logits_processors": {"p": "hello_plugin:P"}}},
            r"entry point hello is missing from the wheel",
        ),
    ],
)
def test_a_wheel_unlike_its_manifest_entry_is_refused(tmp_path, wheel, reason):
    manifest, repository = unpacked(tmp_path, hello_package(tmp_path, **wheel))
    with pytest.raises(PluginError, match=reason):
        prepare_plugins(manifest, repository, tmp_path / "work")
