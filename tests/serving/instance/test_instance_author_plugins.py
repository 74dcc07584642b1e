"""Author plugins at instance start-up: the package's wheels installed into the workdir, the
engine's ``PYTHONPATH``/``VLLM_PLUGINS``, vLLM 0.24's own loaders finding them there, and each bad
plugin refusing the start with the reason before any engine is spawned.

Each vLLM import costs about 6 s of CPU, so a module fixture starts everything at once: real
``python -m serving.instance`` processes (the example plugins; a bad plugin refused by vLLM's
loading; two refused before it) whose engine is a stand-in ``tritonserver``
(``TRITONSERVER_BIN``) recording its environment, and one process running the instance's check
(:mod:`serving.instance.plugin_check`) on the other bad cases, each prepared by the instance's
own install step, one after the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from serving.constraints import LOGITS_PROCESSOR
from serving.instance.plugins import SITE_DIR, prepare_plugins
from serving.package import extract_package
from tests.plugin_examples import example_wheels
from tests.plugin_wheels import make_wheel
from tests.serving.instance_helpers import (
    REPO_ROOT,
    Instance,
    build_plugin_package,
    plugin_entry,
)

pytest.importorskip("vllm")

NO_REPEAT = "no_repeat_window:NoRepeatWindow"
TINY_BIGRAM_ARCH = "TinyBigramForCausalLM"
TRANSFORMERS_BACKEND = "vllm.model_executor.models.transformers:TransformersForCausalLM"

# The stand-in engine: write argv and the plugin environment to the file named first, exit 1.
FAKE_ENGINE = """
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump({"argv": sys.argv[2:], "PYTHONPATH": os.environ.get("PYTHONPATH"),
               "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS")}, f)
sys.exit(1)
"""

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

# vLLM 0.24's own loaders, run in the environment the engine got.
VLLM_LOADERS = """
import importlib, json, sys
from vllm import ModelRegistry
from vllm.plugins import load_plugins_by_group
from vllm.v1.sample.logits_processor import (
    _load_custom_logitsprocs, _load_logitsprocs_by_fqcns, _load_logitsprocs_plugins)
named = json.loads(sys.argv[1])
name = lambda c: f"{c.__module__}:{c.__qualname__}"
general = load_plugins_by_group("vllm.general_plugins")
for func in general.values():
    func()
out = {
    "general": sorted(general),
    "archs": {a: ModelRegistry.models[a].module_name + ":" + ModelRegistry.models[a].class_name
              for a in ModelRegistry.get_supported_archs() if a.startswith("TinyBigram")},
    "by_fqcns": [name(c) for c in _load_logitsprocs_by_fqcns(named)],
    "entry_points": [name(c) for c in _load_logitsprocs_plugins()],
    "custom": [name(c) for c in _load_custom_logitsprocs(named)],
}
# The same wheels as pip installs them, entry points untouched: vLLM's entry point loader finds
# the example processor, and then builds it twice (the entry point and model.json's name).
sys.path.insert(0, sys.argv[2])  # first: importlib.metadata lists a distribution once
importlib.invalidate_caches()
out["pristine_entry_points"] = [name(c) for c in _load_logitsprocs_plugins()]
out["pristine_custom"] = [name(c) for c in _load_custom_logitsprocs(named)]
print(json.dumps(out))
"""


def _registering(name: str, arch: str) -> dict[str, str]:
    module = name.replace("-", "_")
    return {
        f"{module}/__init__.py": (
            "def register():\n"
            "    from vllm import ModelRegistry\n"
            f"    ModelRegistry.register_model({arch!r}, {TRANSFORMERS_BACKEND!r})\n"
        )
    }


def _general(name: str, files: dict[str, str] | None = None, target: str = "register"):
    """(wheel kwargs, entry kwargs) for a general plugin ``name`` -> ``<module>:<target>``."""
    module = name.replace("-", "_")
    points = {module: f"{module}:{target}"}
    return {"entry_points": {"vllm.general_plugins": points}, "files": files or {}}, {
        "general_plugins": points
    }


# name -> (plugins: [(wheel name, make_wheel kwargs, plugin_entry kwargs)], expected reason)
BAD_CASES: dict[str, tuple[list[tuple[str, dict, dict]], list[str]]] = {
    "module_missing": (
        [("missing-module", *_general("missing-module"))],
        ["plugin missing-module 1.0.0", "entry point missing_module = missing_module:register",
         "did not load", "ModuleNotFoundError", "missing_module"],
    ),
    "import_raises": (
        [("import-raises", *_general(
            "import-raises", {"import_raises/__init__.py": "raise RuntimeError('no import')\n"}))],
        ["plugin import-raises 1.0.0", "entry point import_raises = import_raises:register",
         "did not load: RuntimeError: no import"],
    ),
    "not_a_processor": (
        [("not-a-processor",
          {"entry_points": {"vllm.logits_processors": {"plain": "not_a_processor:Plain"}},
           "files": {"not_a_processor/__init__.py": "class Plain:\n    pass\n"}},
          {"logits_processors": {"plain": "not_a_processor:Plain"}})],
        ["plugin not-a-processor 1.0.0", "entry point plain = not_a_processor:Plain",
         "Plain must be a subclass of LogitsProcessor"],
    ),
    "same_architecture": (
        [("arch-one", *_general("arch-one", _registering("arch-one", "SharedArchForCausalLM"))),
         ("arch-two", *_general("arch-two", _registering("arch-two", "SharedArchForCausalLM")))],
        ["registers architecture 'SharedArchForCausalLM'", "already registered",
         "arch_one", "arch_two"],
    ),
    "vllm_architecture": (
        [("llama-again", *_general("llama-again", _registering("llama-again", "LlamaForCausalLM")))],
        ["plugin llama-again 1.0.0", "re-registers architecture 'LlamaForCausalLM'",
         "which vLLM already has"],
    ),
    "plugin_raises": (
        [("plugin-raises", *_general("plugin-raises", {
            "plugin_raises/__init__.py": "def register():\n    raise ValueError('cannot register')\n"
        }))],
        ["plugin plugin-raises 1.0.0", "entry point plugin_raises = plugin_raises:register",
         "raised ValueError: cannot register"],
    ),
    "entry_point_not_in_wheel": (
        [("declares-more", {"files": {"declares_more/__init__.py": ""}},
          {"general_plugins": {"declares_more": "declares_more:register"}})],
        ["plugin declares-more 1.0.0", "vllm.general_plugins entry point declares_more",
         "missing from the wheel"],
    ),
    "shadows_a_module": (
        [("shadows-json", {"files": {"json/__init__.py": ""}}, {})],
        ["top-level module 'json'", "would shadow"],
    ),
}  # fmt: skip


# The instance's check on several prepared cases in one process (one vLLM import).
CHECK_CASES = """
import importlib, json, os, sys
from serving.instance import plugin_check
results = {}
for case in json.loads(sys.stdin.read()):
    site = case["env"]["PYTHONPATH"].split(os.pathsep)[0]
    sys.path.insert(0, site)
    importlib.invalidate_caches()
    os.environ["VLLM_PLUGINS"] = case["env"]["VLLM_PLUGINS"]
    try:
        plugin_check.check_with_vllm(case["spec"])
        results[case["case"]] = "accepted"
    except plugin_check.Refused as exc:
        results[case["case"]] = str(exc)
    sys.path.remove(site)
print(json.dumps(results))
"""
# Refused before the check (no vLLM import): real instances, like the ones vLLM refuses.
BEFORE_CHECK = ("entry_point_not_in_wheel", "shadows_a_module")
REAL_INSTANCE = (*BEFORE_CHECK, "plugin_raises")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """``{case: (instance, workdir, engine record)}`` for the real instances, ``"checked"``:
    the check process's results for the others, ``"built"``: the example wheels."""
    root = tmp_path_factory.mktemp("author-plugins")
    weights = root / "weights"  # never loaded: the engine is a stand-in
    built = example_wheels()
    fake = root / "fake_engine.py"
    fake.write_text(FAKE_ENGINE)

    good = [
        plugin_entry(built["no_repeat_window"], "no-repeat-window",
                     logits_processors={"no_repeat_window": NO_REPEAT}),
        plugin_entry(built["tiny_bigram"], "tiny-bigram",
                     general_plugins={"tiny_bigram": "tiny_bigram:register"}),
    ]  # fmt: skip
    packages = {"good": build_plugin_package(root / "good.tar", weights, good)}
    for case, (specs, _) in BAD_CASES.items():
        entries = [
            plugin_entry(make_wheel(root / "bad" / case, wheel_name, **wheel), wheel_name, **entry)
            for wheel_name, wheel, entry in specs
        ]
        packages[case] = build_plugin_package(root / f"{case}.tar", weights, entries)
    started = {}
    for case in ("good", *REAL_INSTANCE):
        workdir, record = root / f"w-{case}", root / f"{case}.engine.json"
        # What a previous start left: a restart installs afresh.
        (workdir / SITE_DIR / "stale_plugin").mkdir(parents=True)
        env = {"TRITONSERVER_BIN": f"{sys.executable} {fake} {record}", "VLLM_PLUGINS": "x"}
        instance = Instance(
            packages[case], workdir, env=env, engine="tritonserver", ready_timeout=60
        )
        started[case] = (instance, workdir, record)
    cases = []
    for case in BAD_CASES:
        if case in REAL_INSTANCE:
            continue
        workdir = root / f"c-{case}"
        manifest = extract_package(packages[case], workdir / "repository")
        installed, spec = prepare_plugins(manifest, workdir / "repository", workdir)
        cases.append({"case": case, "spec": spec, "env": installed.env})
    checker = subprocess.Popen(
        [sys.executable, "-c", CHECK_CASES],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    checked: dict[str, str] = {}

    def check_results() -> dict[str, str]:
        if not checked:
            out, err = checker.communicate(json.dumps(cases), timeout=120)
            assert checker.returncode == 0, err[-3000:]
            checked.update(json.loads(out.strip().splitlines()[-1]))
        return checked

    yield {"built": built, "checked": check_results, **started}
    if checker.poll() is None:
        checker.kill()
    for instance, _, _ in started.values():
        if instance.proc.poll() is None:
            instance.stop()


def test_wheels_installed_into_the_workdir_and_checked(launched):
    instance, workdir, record = launched["good"]
    assert instance.proc.wait(120) == 1, instance.log()  # the stand-in engine exits 1
    step = instance.step("install_plugins")
    assert step["status"] == "ok", instance.log()
    site = workdir / SITE_DIR
    assert step["site"] == str(site)
    assert step["installed"] == ["no-repeat-window==1.0.0", "tiny-bigram==1.0.0"]
    assert step["loaded"] is True and step["vllm"] == "0.24.0"
    assert step["general_plugins"] == ["tiny_bigram"]
    assert step["registered"] == {"tiny_bigram": [TINY_BIGRAM_ARCH]}
    assert step["logits_processors"] == [LOGITS_PROCESSOR, NO_REPEAT]
    # vLLM would build a processor both installed as an entry point and named in model.json
    # twice: the installed copy keeps only model.json's name.
    assert step["entry_points_dropped"] == [f"no_repeat_window = {NO_REPEAT}"]
    assert step["vllm_plugins"] == "tiny_bigram"
    assert (site / "no_repeat_window" / "__init__.py").is_file()
    assert (site / "tiny_bigram" / "modeling.py").is_file()
    assert not (site / "stale_plugin").exists()  # a restart installs afresh
    # The engine (the tritonserver command line) started after the check, with the plugins.
    engine = json.loads(record.read_text())
    assert engine["VLLM_PLUGINS"] == "tiny_bigram"  # the instance's own "x" replaced
    assert engine["PYTHONPATH"].split(os.pathsep)[0] == str(site)
    assert any(a.startswith("--model-repository=") for a in engine["argv"])
    assert instance.steps() == ["unpack_package", "install_plugins", "clean_metrics_dir",
                                "start_engine"]  # fmt: skip


def test_vllm_own_loaders_find_and_load_them_in_the_engine_environment(launched, tmp_path):
    """The issue's check, literally: vLLM 0.24's general plugin loading with ``VLLM_PLUGINS``
    and its logits processor loaders, in a process with the environment the engine got."""
    instance, _, record = launched["good"]
    assert instance.proc.wait(120) == 1, instance.log()
    engine = json.loads(record.read_text())
    pristine = tmp_path / "pristine"  # the same wheels, installed by pip and left alone
    wheels = [str(w) for w in launched["built"].values()]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(pristine), *wheels],
        check=True,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": engine["PYTHONPATH"], "VLLM_PLUGINS": engine["VLLM_PLUGINS"]}
    named = [LOGITS_PROCESSOR, NO_REPEAT]
    done = subprocess.run(
        [sys.executable, "-c", VLLM_LOADERS, json.dumps(named), str(pristine)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["general"] == ["tiny_bigram"]  # not vLLM's own lora resolvers: VLLM_PLUGINS
    assert out["archs"] == {TINY_BIGRAM_ARCH: TRANSFORMERS_BACKEND}
    assert out["by_fqcns"] == named
    assert out["entry_points"] == []  # dropped from the installed copy ...
    assert out["custom"] == named  # ... so vLLM builds each processor once
    assert out["pristine_entry_points"] == [NO_REPEAT]
    assert out["pristine_custom"] == [NO_REPEAT, *named]  # twice, had it been left


@pytest.mark.parametrize("case", REAL_INSTANCE)
def test_a_bad_plugin_refuses_the_start_before_the_engine(launched, case):
    instance, workdir, record = launched[case]
    assert instance.proc.wait(120) == 2, instance.log()
    step = instance.step("install_plugins")
    assert step["status"] == "failed", instance.log()
    assert step["error"].startswith("PluginError: ")
    for part in BAD_CASES[case][1]:
        assert part in step["error"], step["error"]
    assert instance.steps() == ["unpack_package", "install_plugins"]
    assert instance.events[-1]["event"] == "start_aborted"
    assert not record.exists()  # the engine never started
    assert not (workdir / SITE_DIR / "stale_plugin").exists()  # installed afresh
    if case not in BEFORE_CHECK:
        assert step["installed"] and step["vllm_plugins"]  # it got as far as loading


@pytest.mark.parametrize("case", [c for c in BAD_CASES if c not in REAL_INSTANCE])
def test_a_bad_plugin_is_refused_by_the_check_with_the_reason(launched, case):
    reason = launched["checked"]()[case]
    for part in BAD_CASES[case][1]:
        assert part in reason, reason
