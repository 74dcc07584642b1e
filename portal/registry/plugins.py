"""Author plugin wheels: what a version may ship to extend vLLM, inspected without running them.

A plugin is a wheel (never an sdist: building one runs its ``setup.py``; installing a wheel
runs nothing) that declares entry points in vLLM's groups: ``vllm.general_plugins`` (called at
start-up, e.g. registering a custom architecture with vLLM's ``ModelRegistry``) and
``vllm.logits_processors`` (a V1 ``LogitsProcessor`` class). Everything here reads the archive
as data: the file name's tags, its members' names, ``*.dist-info/METADATA`` (with
``packaging.metadata``) and ``entry_points.txt`` (with ``configparser``).

What is accepted:

- tags installable on the serving image (CPython 3.11, Linux x86_64): interpreter ``py3``,
  ``py311`` or ``cp311``; ABI ``none``, ``abi3`` or ``cp311``; platform ``any``,
  ``manylinux1/2010/2014_x86_64`` or ``manylinux_2_N_x86_64`` with N <= 35 (glibc of the image);
- members with relative paths that stay inside the archive;
- at least one entry point in the two groups, each ``module:attr`` (dotted names);
- ``Requires-Dist`` (markers evaluated for the image, extras ignored) naming only packages the
  serving image has (``docker/serving-image-packages.txt``) at versions it admits; vLLM's is the
  release's own. A plugin cannot bring dependencies: the instance installs it ``--no-deps``.
"""

from __future__ import annotations

import configparser
import hashlib
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from packaging.metadata import InvalidMetadata, Metadata
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

GENERAL_PLUGINS = "vllm.general_plugins"
LOGITS_PROCESSORS = "vllm.logits_processors"
GROUPS = (GENERAL_PLUGINS, LOGITS_PROCESSORS)

SERVING_PYTHON = "3.11"
SERVING_GLIBC_MINOR = 35
#: The environment ``Requires-Dist`` markers are evaluated in: the serving image's interpreter.
MARKER_ENVIRONMENT = {
    "python_version": SERVING_PYTHON,
    "python_full_version": f"{SERVING_PYTHON}.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
ACCEPTED_TAGS = (
    "py3-none-any, py311-none-any, cp311-{none,abi3,cp311}-any, and the same for "
    f"manylinux1/2010/2014_x86_64 or manylinux_2_N_x86_64 with N <= {SERVING_GLIBC_MINOR}"
)
_INTERPRETERS = frozenset({"py3", "py311", "cp311"})
_ABIS = frozenset({"none", "abi3", "cp311"})
_MANYLINUX = re.compile(r"^manylinux_2_(\d+)_x86_64$")
_LEGACY_MANYLINUX = frozenset({"manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"})
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_ENTRY_VALUE = re.compile(rf"^({_DOTTED})\s*:\s*({_DOTTED})$")
_ENTRY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
#: Bound on what the members unpack to (a zip bomb is refused before anything is read).
UNPACKED_RATIO = 4
#: The most of ``METADATA`` and ``entry_points.txt`` inflated (real ones are a few kB; a long
#: README makes a METADATA of a few hundred kB): a small upload whose METADATA inflates to
#: hundreds of MB is refused after this much, not after holding a web worker for seconds.
METADATA_MAX_BYTES = 1 << 20
ENTRY_POINTS_MAX_BYTES = 64 << 10
#: A member inflating to more than this many times its compressed size is a decompression bomb
#: (code and data compress 2 to 10 times; deflate's own limit is about 1,000), refused from its
#: declared sizes before anything is inflated; members under RATIO_CHECKED_FROM may compress
#: as well as they like.
MEMBER_RATIO_MAX = 100
RATIO_CHECKED_FROM = 1 << 20


class PluginRefused(ValueError):
    """The wheel cannot be a plugin; the message says why, for the author."""


@dataclass(frozen=True)
class PluginWheelInfo:
    filename: str
    name: str
    version: str
    sha256: str
    size: int
    general_plugins: dict[str, str] = field(default_factory=dict)
    logits_processors: dict[str, str] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)

    @property
    def entry_points(self) -> dict[str, dict[str, str]]:
        return {GENERAL_PLUGINS: self.general_plugins, LOGITS_PROCESSORS: self.logits_processors}


# --- the serving image's packages ---------------------------------------------------------------


def serving_image_packages(path: Path | None = None) -> dict[str, str | None]:
    """``{canonical name: version or None (present, version not recorded)}``."""
    path = Path(path or settings.SERVING_IMAGE_PACKAGES_FILE)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PluginRefused(
            f"the serving image's package list ({path}) cannot be read ({exc.strerror}), so no "
            "plugin's requirements can be checked; an operator must install it"
        ) from exc
    packages: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        packages[canonicalize_name(name.strip())] = version.strip() or None
    return packages


def requirement_errors(requires: Iterable[str], release: Any) -> list[str]:
    """Why ``requires`` (Requires-Dist lines) cannot be met by ``release``'s serving image."""
    image = serving_image_packages()
    image["vllm"] = release.vllm_version
    errors = []
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            errors.append(f"has an unreadable requirement {line!r}")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(MARKER_ENVIRONMENT):
            continue
        shown = str(Requirement(line.split(";", 1)[0]))
        name = canonicalize_name(requirement.name)
        if requirement.url:
            errors.append(f"requires {shown}: a URL, which the serving image cannot install from")
            continue
        if name not in image:
            errors.append(
                f"requires {requirement.name}, which the serving image does not have; vendor it "
                "or ask the operators"
            )
            continue
        have = image[name]
        if have is None or requirement.specifier.contains(have, prereleases=True):
            continue
        if name == "vllm":
            errors.append(f"requires {shown}, the release {release.name} pins vllm {have}")
        else:
            errors.append(
                f"requires {shown}, the serving image of release {release.name} has "
                f"{requirement.name} {have}"
            )
    return errors


# --- one wheel ----------------------------------------------------------------------------------


def _check_tags(filename: str) -> tuple[str, str]:
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise PluginRefused(f"{filename!r} is not a wheel file name: {exc}") from exc
    for tag in tags:
        if tag.interpreter in _INTERPRETERS and tag.abi in _ABIS:
            match = _MANYLINUX.match(tag.platform)
            if (
                tag.platform == "any"
                or tag.platform in _LEGACY_MANYLINUX
                or (match and int(match.group(1)) <= SERVING_GLIBC_MINOR)
            ):
                return str(name), str(version)
    raise PluginRefused(
        f"{filename}: its tags ({', '.join(sorted(map(str, tags)))}) do not install on the serving "
        f"image (CPython {SERVING_PYTHON}, Linux x86_64); accepted: {ACCEPTED_TAGS}"
    )


def _check_members(archive: zipfile.ZipFile, filename: str, max_bytes: int) -> list[str]:
    names = []
    unpacked = 0
    for info in archive.infolist():
        name = info.filename
        path = PurePosixPath(name)
        if (
            not name
            or "\\" in name
            or "\x00" in name
            or path.is_absolute()
            or any(part in ("..", ".") for part in name.rstrip("/").split("/"))
        ):
            raise PluginRefused(
                f"{filename}: member {name!r} leaves the archive (absolute or '..')"
            )
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            raise PluginRefused(f"{filename}: member {name!r} is a symbolic link")
        if info.file_size > RATIO_CHECKED_FROM and info.file_size > MEMBER_RATIO_MAX * max(
            info.compress_size, 1
        ):
            raise PluginRefused(
                f"{filename}: member {name!r} inflates {info.compress_size} bytes to "
                f"{info.file_size} (over {MEMBER_RATIO_MAX} times): refused as a decompression bomb"
            )
        unpacked += info.file_size
        if unpacked > UNPACKED_RATIO * max_bytes:
            raise PluginRefused(f"{filename}: unpacks to over {UNPACKED_RATIO * max_bytes} bytes")
        names.append(name)
    return names


def _read_small(archive: zipfile.ZipFile, filename: str, member: str, max_bytes: int) -> bytes:
    """A member known to be small, refused from its declared size, and inflated no further than
    ``max_bytes`` whatever it declares. Raises KeyError when the archive lacks it."""
    info = archive.getinfo(member)
    over = PluginRefused(f"{filename}: {member} is over {max_bytes} bytes")
    if info.file_size > max_bytes:
        raise over
    with archive.open(info) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise over
    return data


def _read_metadata(archive: zipfile.ZipFile, filename: str, dist_info: str) -> Metadata:
    try:
        text = _read_small(archive, filename, f"{dist_info}/METADATA", METADATA_MAX_BYTES)
    except KeyError as exc:
        raise PluginRefused(f"{filename}: no {dist_info}/METADATA") from exc
    try:
        return Metadata.from_email(text, validate=True)
    except (InvalidMetadata, ExceptionGroup, ValueError) as exc:
        detail = "; ".join(str(e) for e in getattr(exc, "exceptions", [exc]))
        raise PluginRefused(f"{filename}: unreadable METADATA ({detail})") from exc


def _read_entry_points(
    archive: zipfile.ZipFile, filename: str, dist_info: str
) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {group: {} for group in GROUPS}
    try:
        text = _read_small(
            archive, filename, f"{dist_info}/entry_points.txt", ENTRY_POINTS_MAX_BYTES
        ).decode("utf-8")
    except KeyError:
        text = ""
    except UnicodeDecodeError as exc:
        raise PluginRefused(f"{filename}: entry_points.txt is not UTF-8") from exc
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # names keep their case
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise PluginRefused(f"{filename}: unreadable entry_points.txt ({exc.message})") from exc
    for group in GROUPS:
        if not parser.has_section(group):
            continue
        for name, value in parser.items(group):
            if not _ENTRY_NAME.match(name):
                raise PluginRefused(
                    f"{filename}: [{group}] entry point name {name!r} is not usable"
                )
            match = _ENTRY_VALUE.match(value.strip())
            if not match:
                raise PluginRefused(
                    f"{filename}: [{group}] {name} = {value!r} is not 'module:attr' (dotted "
                    "Python names, no extras)"
                )
            found[group][name] = f"{match.group(1)}:{match.group(2)}"
    if not any(found.values()):
        raise PluginRefused(
            f"{filename}: declares no entry point in [{GENERAL_PLUGINS}] or [{LOGITS_PROCESSORS}]; "
            "vLLM would never load it"
        )
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def inspect_wheel(
    path: Path | str,
    *,
    filename: str | None = None,
    release: Any = None,
    max_bytes: int | None = None,
) -> PluginWheelInfo:
    """Read ``path`` as a plugin wheel (``filename``: its name, when the file on disk is an
    upload's temporary one) and, given ``release``, check its requirements against that
    release's serving image. Raises :class:`PluginRefused` with the reason."""
    path = Path(path)
    filename = filename or path.name
    if "/" in filename or "\\" in filename:
        raise PluginRefused(f"{filename!r}: a file name, not a path")
    if not filename.endswith(".whl"):
        raise PluginRefused(
            f"{filename}: only wheels (.whl): nothing may execute at install, and building an "
            "sdist runs its code"
        )
    max_bytes = settings.PLUGIN_WHEEL_MAX_BYTES if max_bytes is None else max_bytes
    size = path.stat().st_size
    if size > max_bytes:
        raise PluginRefused(f"{filename}: {size} bytes, over the limit of {max_bytes} bytes")
    name, version = _check_tags(filename)
    try:
        with zipfile.ZipFile(path) as archive:
            names = _check_members(archive, filename, max_bytes)
            dist_infos = sorted(
                {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
            )
            if len(dist_infos) != 1:
                raise PluginRefused(
                    f"{filename}: {len(dist_infos)} .dist-info directories, a wheel has one"
                )
            metadata = _read_metadata(archive, filename, dist_infos[0])
            entry_points = _read_entry_points(archive, filename, dist_infos[0])
    except zipfile.BadZipFile as exc:
        raise PluginRefused(f"{filename}: not a readable zip archive ({exc})") from exc
    if canonicalize_name(metadata.name) != canonicalize_name(name):
        raise PluginRefused(f"{filename}: METADATA names {metadata.name!r}, the file name {name!r}")
    if metadata.version != Version(version):
        raise PluginRefused(f"{filename}: METADATA says version {metadata.version}")
    if metadata.requires_python is not None and not metadata.requires_python.contains(
        f"{SERVING_PYTHON}.0"
    ):
        raise PluginRefused(
            f"{filename}: requires Python {metadata.requires_python}, the serving image runs "
            f"{SERVING_PYTHON}"
        )
    requires = [str(r) for r in metadata.requires_dist or []]
    info = PluginWheelInfo(
        filename=filename,
        name=metadata.name,
        version=str(metadata.version),
        sha256=_sha256(path),
        size=size,
        general_plugins=entry_points[GENERAL_PLUGINS],
        logits_processors=entry_points[LOGITS_PROCESSORS],
        requires=requires,
    )
    if release is not None:
        check_requirements(info, release)
    return info


def check_requirements(info: PluginWheelInfo, release: Any) -> None:
    errors = requirement_errors(info.requires, release)
    if errors:
        raise PluginRefused(f"{info.filename}: " + "; ".join(errors))


# --- several wheels in one version --------------------------------------------------------------


def clash_errors(
    plugins: Iterable[PluginWheelInfo], max_total_bytes: int | None = None
) -> list[str]:
    """Two plugins of one version with the same distribution or the same entry point name in a
    group (vLLM would load one and silently skip the other), or all of them over the size limit."""
    errors: list[str] = []
    dists: dict[str, str] = {}
    names: dict[tuple[str, str], str] = {}
    total = 0
    for plugin in plugins:
        total += plugin.size
        dist = canonicalize_name(plugin.name)
        if dist in dists and dists[dist] != plugin.filename:
            errors.append(f"{plugin.filename} and {dists[dist]} are both the distribution {dist}")
        dists.setdefault(dist, plugin.filename)
        for group, entries in plugin.entry_points.items():
            for name in entries:
                other = names.setdefault((group, name), plugin.filename)
                if other != plugin.filename:
                    errors.append(
                        f"{plugin.filename} and {other} both declare the entry point {name!r} in "
                        f"[{group}]"
                    )
    limit = settings.PLUGIN_WHEELS_MAX_TOTAL_BYTES if max_total_bytes is None else max_total_bytes
    if total > limit:
        errors.append(f"the plugins weigh {total} bytes together, over the limit of {limit} bytes")
    return errors


def info_from_json(data: dict[str, Any]) -> PluginWheelInfo:
    """Back from a manifest's ``plugins`` entry (or a stored row's fields)."""
    return PluginWheelInfo(
        filename=PurePosixPath(data["file"]).name if "file" in data else data["filename"],
        name=data["name"],
        version=data["version"],
        sha256=data["sha256"],
        size=data["size"],
        general_plugins=dict(data.get("general_plugins", {})),
        logits_processors=dict(data.get("logits_processors", {})),
        requires=list(data.get("requires", [])),
    )


def info_from_row(wheel: Any) -> PluginWheelInfo:
    """From a stored :class:`~portal.registry.models.PluginWheel`."""
    groups = wheel.entry_points or {}
    return PluginWheelInfo(
        filename=wheel.filename,
        name=wheel.name,
        version=wheel.version,
        sha256=wheel.sha256,
        size=wheel.size,
        general_plugins=dict(groups.get(GENERAL_PLUGINS, {})),
        logits_processors=dict(groups.get(LOGITS_PROCESSORS, {})),
        requires=list(wheel.requires),
    )


def version_plugins(version: Any) -> list[dict[str, Any]]:
    """The version's plugins: as its package manifest lists them once packaged, else its
    uploaded ones."""
    uploaded = list(version.plugins.all())
    shas = {wheel.sha256 for wheel in uploaded}
    packaged = (version.package_manifest or {}).get("plugins")
    if packaged:
        return [
            {
                **{k: entry[k] for k in ("name", "version", "sha256", "size")},
                "filename": entry["file"].rsplit("/", 1)[-1],
                "origin": "uploaded" if entry["sha256"] in shas else "artifact",
                "general_plugins": entry["general_plugins"],
                "logits_processors": entry["logits_processors"],
            }
            for entry in packaged
        ]
    return [
        {
            "name": wheel.name,
            "version": wheel.version,
            "filename": wheel.filename,
            "sha256": wheel.sha256,
            "size": wheel.size,
            "origin": "uploaded",
            "general_plugins": dict((wheel.entry_points or {}).get(GENERAL_PLUGINS, {})),
            "logits_processors": dict((wheel.entry_points or {}).get(LOGITS_PROCESSORS, {})),
        }
        for wheel in uploaded
    ]
