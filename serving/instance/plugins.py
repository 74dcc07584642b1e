"""Installing and checking, before the engine starts, the plugins a package needs.

Two kinds of plugin, one step (the supervisor's ``install_plugins``):

* **Platform plugins** (manifest ``constraint_plugins``): the platform's own logits processors,
  which the packager names in every vLLM model.json by qualified class name (``module:Class``;
  :func:`serving.package.vllm_repository_files`); the project registers no entry point for them.
* **Author plugins** (manifest ``plugins``): wheels shipped in the package at
  ``<model>/plugins/<wheel>`` (their sha256 checked by the unpack step like every member), each
  declaring ``vllm.general_plugins`` entry points (a function vLLM calls in every process, e.g.
  to register an architecture with ``ModelRegistry``) and/or ``vllm.logits_processors`` entry
  points (a ``LogitsProcessor`` class, which the packager also names in model.json).

The wheels are installed afresh on every start (the package is the truth) into the instance's
own ``<workdir>/plugins-site`` with ``pip install --no-deps --no-index --target`` (nothing from
the network, nothing outside the workdir), and the engine gets that directory first on
``PYTHONPATH`` and ``VLLM_PLUGINS`` set to exactly the declared general plugins (``""`` when
there are none: vLLM 0.24 splits the variable on commas, and ``[""]`` matches no plugin, so no
other installed general plugin loads; unset would load them all) — :func:`plugin_environment`.

vLLM 0.24 loads *every* installed ``vllm.logits_processors`` entry point whatever
``VLLM_PLUGINS`` says (``_load_logitsprocs_plugins``) and then the classes model.json names
(``_load_logitsprocs_by_fqcns``), and builds one instance per class listed: a processor both
installed as an entry point and named would run twice per step. Model.json's names are the ones
vLLM needs (only named processors make it fill in output token IDs under async scheduling), so
the install step drops the ``vllm.logits_processors`` entry points of the installed copy that
model.json names, and each author processor is built once.

Then, before the engine starts, a child process with exactly the engine's environment
(:mod:`serving.instance.plugin_check`) loads everything as vLLM will and calls each general
plugin; whatever fails (an entry point missing or not importing, a processor that is no
``LogitsProcessor``, a plugin function raising, two plugins registering one architecture name
or one re-registering vLLM's own) refuses the start with a reason naming the plugin and entry
point. Where vLLM is not installed (the CPU engine's setup: ``./dev run``, local instances) the
entry points are only imported, and the platform plugins only checked by name: the CPU engine
applies the platform's constraints itself (:mod:`serving.engine.constraints`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from serving.constraints import LOGITS_PROCESSOR

# THE mapping from a plugin name as the portal writes it into a package manifest
# (``constraint_plugins``) to the logits processor a model.json names for it.
PLATFORM_PLUGINS: dict[str, str] = {
    "platform-constraints": LOGITS_PROCESSOR,
}

GENERAL_GROUP = "vllm.general_plugins"
LOGITS_GROUP = "vllm.logits_processors"
SITE_DIR = "plugins-site"  # under the instance's workdir
PIP_TIMEOUT_S = 120.0
CHECK_TIMEOUT_S = 300.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY_POINT_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # no comma: VLLM_PLUGINS is comma-joined
_QUALIFIED = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_NOT_MODULES = {"bin", "__pycache__"}


class PluginError(RuntimeError):
    """A plugin the package needs is unknown, does not install, or does not load."""


@dataclass(frozen=True)
class AuthorPlugin:
    """One ``plugins`` entry of the manifest, as the portal's packager writes it."""

    file: str  # <model>/plugins/<wheel filename>, a member of the package
    sha256: str
    size: int
    name: str
    version: str
    general_plugins: dict[str, str]  # entry point name -> "module:function"
    logits_processors: dict[str, str]  # entry point name -> "module:Class"

    def entries(self, group: str) -> list[dict[str, str]]:
        points = self.general_plugins if group == GENERAL_GROUP else self.logits_processors
        return [
            {"plugin": self.name, "version": self.version, "entry_point": k, "value": v}
            for k, v in points.items()
        ]


NOT_LOADED = (
    "vLLM is not installed: entry points only imported; general plugins not called, "
    "logits processors' base class not checked"
)
#: The CPU engine applies the platform's constraints itself (serving.engine.constraints) and
#: never loads the platform's vLLM processor: importing vLLM (seconds) to check it would check
#: nothing that engine runs.
CPU_ENGINE_PLATFORM_ONLY = (
    "the CPU engine applies the platform's constraints natively: vLLM loads no plugin of this "
    "package, so none was loaded here"
)


@dataclass
class InstalledPlugins:
    logits_processors: list[str] = field(default_factory=list)  # what vLLM is given, in order
    loaded: bool = True  # False: not loaded by vLLM here; ``check`` in the info says why
    vllm: str | None = None  # the vLLM version that loaded them
    installed: list[str] = field(default_factory=list)  # "name==version" of each wheel
    general_plugins: list[str] = field(default_factory=list)  # entry point names
    registered: dict[str, list[str]] = field(default_factory=dict)  # plugin -> architectures
    site: str | None = None  # the directory the wheels went into
    env: dict[str, str] = field(default_factory=dict)  # what the engine's environment gains
    not_loaded_because: str = NOT_LOADED

    def info(self) -> dict[str, Any]:
        """The step's fields in the start-up log."""
        return {
            "installed": self.installed,
            "site": self.site,
            "vllm_plugins": self.env.get("VLLM_PLUGINS", ""),
            "general_plugins": self.general_plugins,
            "registered": self.registered,
            "logits_processors": self.logits_processors,
            "loaded": self.loaded,
            "vllm": self.vllm,
            **({} if self.loaded else {"check": self.not_loaded_because}),
        }


# --- the manifest ------------------------------------------------------------------------------


def platform_processors(names: Any) -> list[str]:
    """The logits processors the manifest's ``constraint_plugins`` stand for."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise PluginError("manifest field 'constraint_plugins' must be a list of names")
    processors: list[str] = []
    for name in names:
        if name not in PLATFORM_PLUGINS:
            raise PluginError(
                f"constraint_plugins names unknown plugin {name!r}; known: {sorted(PLATFORM_PLUGINS)}"
            )
        processors.append(PLATFORM_PLUGINS[name])
    return processors


def _entry_points(value: Any, where: str, kind: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PluginError(f"{where}: {kind} must be an object of entry point name -> target")
    for name, target in value.items():
        if not isinstance(name, str) or not _ENTRY_POINT_NAME.fullmatch(name):
            raise PluginError(f"{where}: {kind} entry point name {name!r} is not a plain name")
        if not isinstance(target, str) or not _QUALIFIED.fullmatch(target):
            raise PluginError(f"{where}: {kind} entry point {name} = {target!r} is not module:attr")
    return dict(value)


def author_plugins(manifest: Mapping[str, Any]) -> list[AuthorPlugin]:
    """The manifest's ``plugins``, checked against its shape and its ``files`` list."""
    entries = manifest.get("plugins") or []
    if not isinstance(entries, list):
        raise PluginError("manifest field 'plugins' must be a list")
    files = {
        f.get("path"): (f.get("sha256"), f.get("size"))
        for f in manifest.get("files", [])
        if isinstance(f, dict)
    }
    plugins: list[AuthorPlugin] = []
    for index, entry in enumerate(entries):
        where = f"manifest plugins[{index}]"
        if not isinstance(entry, dict):
            raise PluginError(f"{where} is not an object")
        name, version, path = entry.get("name"), entry.get("version"), entry.get("file")
        if not all(isinstance(v, str) and v for v in (name, version, path)):
            raise PluginError(f"{where}: 'name', 'version' and 'file' must be non-empty strings")
        assert isinstance(name, str) and isinstance(version, str) and isinstance(path, str)
        where = f"plugin {name} {version}"
        parts = PurePosixPath(path).parts
        if (
            len(parts) != 3
            or parts[:2] != (manifest["model"], "plugins")
            or not parts[2].endswith(".whl")
        ):
            raise PluginError(f"{where}: file {path!r} is not {manifest['model']}/plugins/<wheel>")
        sha256, size = entry.get("sha256"), entry.get("size")
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise PluginError(f"{where}: 'sha256' must be 64 lowercase hex digits")
        if files.get(path) != (sha256, size):
            raise PluginError(
                f"{where}: {path} is not a package member with that sha256 and size "
                "in the manifest's files"
            )
        plugin = AuthorPlugin(
            file=path,
            sha256=sha256,
            size=size,  # type: ignore[arg-type]  # equal to the files entry's int
            name=name,
            version=version,
            general_plugins=_entry_points(entry.get("general_plugins"), where, GENERAL_GROUP),
            logits_processors=_entry_points(entry.get("logits_processors"), where, LOGITS_GROUP),
        )
        plugins.append(plugin)
    _check_unique(plugins)
    return plugins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _check_unique(plugins: list[AuthorPlugin]) -> None:
    seen_dists: set[str] = set()
    seen: dict[tuple[str, str], str] = {}
    for plugin in plugins:
        if _canonical(plugin.name) in seen_dists:
            raise PluginError(f"plugin {plugin.name} is listed twice in the manifest")
        seen_dists.add(_canonical(plugin.name))
        for group in (GENERAL_GROUP, LOGITS_GROUP):
            for entry in plugin.entries(group):
                key = (group, entry["entry_point"])
                if key in seen:
                    raise PluginError(
                        f"{group} entry point {key[1]!r} is declared by both plugin "
                        f"{seen[key]} and plugin {plugin.name}"
                    )
                seen[key] = plugin.name


def model_json_processors(manifest: Mapping[str, Any], repository: Path) -> list[str] | None:
    """model.json's ``logits_processors`` (``[]`` when it names none); ``None`` for a package
    without a vLLM model.json. Every version directory must name the same list."""
    found: list[list[str]] = []
    for path in sorted((repository / manifest["model"]).glob("*/model.json")):
        names = json.loads(path.read_text()).get("logits_processors") or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise PluginError(f"{path.relative_to(repository)}: logits_processors is not a list")
        found.append(names)
    if not found:
        return None
    if any(names != found[0] for names in found):
        raise PluginError("the model's versions name different logits_processors in model.json")
    return found[0]


# --- the install -------------------------------------------------------------------------------


def install_wheels(wheels: list[Path], site: Path) -> None:
    """``site`` afresh, holding exactly ``wheels`` (no dependencies, no index, no network)."""
    if site.exists() or site.is_symlink():
        shutil.rmtree(site)
    if not wheels:
        return
    site.mkdir(parents=True)
    command = [
        sys.executable, "-m", "pip", "install", "--isolated", "--no-deps", "--no-index",
        "--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check",
        "--no-warn-script-location", "--quiet", "--target", str(site), *map(str, wheels),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise PluginError(
            f"pip did not install the plugin wheels within {PIP_TIMEOUT_S:g}s"
        ) from exc
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        names = ", ".join(w.name for w in wheels)
        raise PluginError(f"pip could not install {names}: {tail}")


def _installed(site: Path) -> dict[str, importlib.metadata.Distribution]:
    return {
        _canonical(dist.metadata["Name"]): dist
        for dist in importlib.metadata.distributions(path=[str(site)])
    }


def check_installed(plugins: list[AuthorPlugin], site: Path) -> None:
    """Each wheel installed as the manifest describes it (metadata only, nothing imported):
    its version, and exactly the declared ``vllm.general_plugins`` and
    ``vllm.logits_processors`` entry points; and no module of it shadowing one the engine
    already has (``PYTHONPATH`` puts ``site`` before the image's packages)."""
    dists = _installed(site)
    for plugin in plugins:
        dist = dists.get(_canonical(plugin.name))
        if dist is None or dist.version != plugin.version:
            found = f"{dist.version}" if dist is not None else "nothing"
            raise PluginError(
                f"plugin {plugin.name} {plugin.version}: its wheel {plugin.file} installed {found}"
            )
        for group, declared in (
            (GENERAL_GROUP, plugin.general_plugins),
            (LOGITS_GROUP, plugin.logits_processors),
        ):
            actual = {ep.name: ep.value for ep in dist.entry_points.select(group=group)}
            for name, value in declared.items():
                if name not in actual:
                    raise PluginError(
                        f"plugin {plugin.name} {plugin.version}: {group} entry point {name} "
                        "is missing from the wheel"
                    )
                if actual[name] != value:
                    raise PluginError(
                        f"plugin {plugin.name} {plugin.version}: {group} entry point {name} is "
                        f"{actual[name]} in the wheel, {value} in the manifest"
                    )
            if undeclared := sorted(set(actual) - set(declared)):
                raise PluginError(
                    f"plugin {plugin.name} {plugin.version}: the wheel has {group} entry points "
                    f"the manifest does not declare: {undeclared}"
                )
    if unlisted := sorted(set(dists) - {_canonical(p.name) for p in plugins}):
        raise PluginError(f"installed distributions no plugin entry lists: {unlisted}")
    for entry in sorted(site.iterdir()):
        if entry.name in _NOT_MODULES or entry.suffix in (".dist-info", ".data"):
            continue
        module = entry.name.split(".")[0]
        if module.isidentifier() and importlib.machinery.PathFinder.find_spec(module):
            raise PluginError(
                f"a plugin wheel installs top-level module {module!r}, which would shadow the "
                "one the engine already has"
            )


def drop_named_entry_points(site: Path, named: list[str]) -> list[str]:
    """Remove, from the installed copy, the ``vllm.logits_processors`` entry points whose class
    model.json names: vLLM 0.24 loads both lists and would build such a processor twice.
    Returns ``"name = value"`` of each one dropped."""
    dropped: list[str] = []
    for info in sorted(site.glob("*.dist-info")):
        dist = importlib.metadata.PathDistribution(info)
        points = list(dist.entry_points)
        keep = [ep for ep in points if not (ep.group == LOGITS_GROUP and ep.value in named)]
        if len(keep) == len(points):
            continue
        dropped += [f"{ep.name} = {ep.value}" for ep in points if ep not in keep]
        groups: dict[str, list[str]] = {}
        for ep in keep:
            groups.setdefault(ep.group, []).append(f"{ep.name} = {ep.value}\n")
        text = "".join(f"[{g}]\n{''.join(lines)}\n" for g, lines in groups.items())
        (info / "entry_points.txt").write_text(text)
    return dropped


def plugin_environment(
    base: Mapping[str, str], site: Path | None, general_plugins: list[str]
) -> dict[str, str]:
    """What the engine's environment gains: ``PYTHONPATH`` led by ``site`` (when wheels were
    installed) and ``VLLM_PLUGINS`` naming exactly ``general_plugins`` (``""`` for none)."""
    env = {"VLLM_PLUGINS": ",".join(general_plugins)}
    if site is not None:
        existing = base.get("PYTHONPATH")
        env["PYTHONPATH"] = f"{site}{os.pathsep}{existing}" if existing else str(site)
    return env


# --- the check ---------------------------------------------------------------------------------


def run_check(spec: dict[str, Any], env: Mapping[str, str], scratch: Path) -> dict[str, Any]:
    """:mod:`serving.instance.plugin_check` in a child with ``env``; its result, or
    :class:`PluginError` with its reason."""
    with tempfile.TemporaryDirectory(prefix="plugin-check.", dir=scratch) as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        command = [sys.executable, "-m", "serving.instance.plugin_check"]
        try:
            done = subprocess.run(
                [*command, str(spec_path), str(result_path)],
                env=dict(env),
                capture_output=True,
                text=True,
                timeout=CHECK_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PluginError(f"loading the plugins took over {CHECK_TIMEOUT_S:g}s") from exc
        if not result_path.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-5:])
            raise PluginError(
                f"the plugin check exited with status {done.returncode} before reporting "
                f"(a plugin exiting or crashing the process?): {tail}"
            )
        result: dict[str, Any] = json.loads(result_path.read_text())
    if not result.get("ok"):
        raise PluginError(result.get("error", "the plugin check failed"))
    return result


def prepare_plugins(
    manifest: Mapping[str, Any],
    repository: Path,
    workdir: Path,
    *,
    base_env: Mapping[str, str] | None = None,
    progress: dict[str, Any] | None = None,
    engine: str = "tritonserver",
) -> tuple[InstalledPlugins, dict[str, Any] | None]:
    """Everything before the load check: the manifest's plugins checked, the wheels installed
    afresh into ``<workdir>/plugins-site`` and checked against it (metadata only), the engine's
    environment. Returns that and the check's spec (``None``: nothing to load, as where vLLM is
    not installed, or the CPU ``engine`` serves a package without wheels). ``progress`` gets
    what was done so far."""
    base = os.environ if base_env is None else base_env
    progress = {} if progress is None else progress
    named_platform = platform_processors(manifest.get("constraint_plugins", []))
    plugins = author_plugins(manifest)
    model_json = model_json_processors(manifest, repository)
    author_processors = [v for p in plugins for v in p.logits_processors.values()]
    if author_processors:
        if model_json is None:
            raise PluginError(
                "the package declares logits processors but has no vLLM model.json to name them"
            )
        if missing := [name for name in author_processors if name not in model_json]:
            raise PluginError(f"model.json's logits_processors does not name {missing}")
    processors = list(model_json or [])
    processors += [p for p in named_platform if p not in processors]

    site = workdir / SITE_DIR
    install_wheels([repository / p.file for p in plugins], site)  # a previous copy goes
    installed = InstalledPlugins(
        logits_processors=processors,
        installed=[f"{p.name}=={p.version}" for p in plugins],
        general_plugins=[e for p in plugins for e in p.general_plugins],
        site=str(site) if plugins else None,
    )
    progress["installed"] = installed.installed
    if plugins:
        check_installed(plugins, site)
        progress["entry_points_dropped"] = drop_named_entry_points(site, processors)
    installed.env = plugin_environment(base, site if plugins else None, installed.general_plugins)
    progress["vllm_plugins"] = installed.env["VLLM_PLUGINS"]
    if not plugins and engine == "cpu":
        installed.loaded = False  # the platform plugins are checked by name
        installed.not_loaded_because = CPU_ENGINE_PLATFORM_ONLY
        return installed, None
    if importlib.util.find_spec("vllm") is None and not plugins:
        installed.loaded = False  # nothing to import: the platform plugins are checked by name
        return installed, None
    spec = {
        "general_plugins": [e for p in plugins for e in p.entries(GENERAL_GROUP)],
        "logits_processors": [e for p in plugins for e in p.entries(LOGITS_GROUP)],
        "named_processors": processors,
    }
    return installed, spec


def install_plugins(
    manifest: Mapping[str, Any],
    repository: Path,
    workdir: Path,
    *,
    base_env: Mapping[str, str] | None = None,
    progress: dict[str, Any] | None = None,
    engine: str = "tritonserver",
) -> InstalledPlugins:
    """Install the package's author plugins and load them, and the platform plugins it names,
    as the engine will (:func:`prepare_plugins`, then :func:`run_check` with the engine's
    environment); raises :class:`PluginError` with the reason when anything would not load.
    ``progress`` gets what was done so far (the step's log fields, also when it fails)."""
    base = os.environ if base_env is None else base_env
    installed, spec = prepare_plugins(
        manifest, repository, workdir, base_env=base, progress=progress, engine=engine
    )
    if spec is None:
        return installed
    result = run_check(spec, {**base, **installed.env}, workdir)
    installed.loaded = result["vllm"] is not None
    installed.vllm = result["vllm"]
    installed.registered = result["registered"]
    return installed


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
