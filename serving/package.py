"""The model package format: written by the portal, unpacked safely at instance start-up.

A package is a tar archive built by the portal: a Triton model repository plus
``manifest.json`` listing every file with its sha256 and size. The archive crosses a trust
boundary (object store, shared filesystem), so nothing in it is trusted: no links, devices,
absolute paths or ``..``; sizes are bounded; and every checksum is verified in a private
staging directory before the result is renamed into place, so a half-checked or hostile
package is never visible at ``target``.

A vLLM-backend package may carry author plugin wheels at ``<model>/plugins/<wheel>`` (Triton
ignores a model's non-numeric subdirectories), each listed in ``files`` like any member and
described in the manifest's ``plugins`` (absent when there are none)::

    "plugins": [{"file": "<model>/plugins/<wheel>", "sha256": "...", "size": N,
                 "name": "<distribution>", "version": "...",
                 "general_plugins": {"<entry point>": "module:attr"},
                 "logits_processors": {"<entry point>": "module:Class"}}]

``model.json``'s ``logits_processors`` then names the platform's processor followed by each
plugin processor's ``module:Class``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.constraints import LOGITS_PROCESSOR

MANIFEST_NAME = "manifest.json"
# A Triton model repository's files (read back by serving.repository): the model's
# configuration, and a vLLM-backend version's engine arguments.
CONFIG_FILE = "config.pbtxt"
ENGINE_ARGS_FILE = "model.json"
# The config.pbtxt parameter naming how a model writes tool calls under tool_choice auto, and
# the formats the OpenAI front end reads (serving.frontend.tool_parsers).
TOOL_CALL_PARSER = "tool_call_parser"
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral")
MANIFEST_FORMAT = 1
CHUNK = 1 << 20
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


# --- the vLLM-backend model repository --------------------------------------------------------


def vllm_config(name: str, number: int) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="vllm", max_batch_size=0)
    # Triton's vLLM backend streams responses: it asserts a decoupled transaction policy.
    config.model_transaction_policy.decoupled = True
    group = config.instance_group.add()
    group.count = 1
    group.kind = mc.ModelInstanceGroup.KIND_MODEL  # vLLM places itself on the GPUs
    config.version_policy.specific.versions.append(number)
    # Bridges vLLM's own metrics into Triton's /metrics (the unified endpoint merges the rest).
    config.parameters["REPORT_CUSTOM_METRICS"].string_value = "true"
    return config


def render_config(config: mc.ModelConfig) -> str:
    """Text format, then parsed back with Triton's schema: what Triton will read is checked."""
    text = text_format.MessageToString(config)
    text_format.Parse(text, mc.ModelConfig())  # raises ParseError on a builder bug
    return text


# ``convert`` values that make vLLM 0.24 run a generative checkpoint as a pooling model.
_POOLING_CONVERSIONS = frozenset({"embed", "classify", "reward"})


def takes_logits_processors(engine_args: dict[str, Any]) -> bool:
    """Whether vLLM 0.24 accepts a named logits processor for these engine arguments: it refuses
    one outright for pooling models and with speculative decoding ("Pooling models do not
    support custom logits processors", ``build_logitsprocs``), so the model would not load."""
    pooling = (
        engine_args.get("runner") == "pooling" or engine_args.get("convert") in _POOLING_CONVERSIONS
    )
    return not pooling and not engine_args.get("speculative_config")


def vllm_repository_files(
    name: str,
    number: int,
    weights: str,
    engine_args: dict[str, Any],
    *,
    tool_call_parser: str | None = None,
    logits_processors: Sequence[str] = (),
) -> dict[str, bytes]:
    """``config.pbtxt`` and ``<number>/model.json`` for Triton's vLLM backend, as
    ``{relative path: content}``; ``engine_args`` are the author's (already validated).
    ``tool_call_parser`` (how the model writes tool calls) is a model parameter the OpenAI
    front end reads; Triton keeps parameters it does not use. ``logits_processors`` are the
    author plugins' processors (``module:Class``), named after the platform's own."""
    if logits_processors and not takes_logits_processors(engine_args):
        raise ValueError(
            "vLLM refuses custom logits processors for pooling models and with speculative decoding"
        )
    model_json = {
        "model": weights,
        "tokenizer": weights,
        # Needed for vLLM's metrics, which the unified /metrics endpoint serves.
        "disable_log_stats": False,
        **engine_args,
    }
    if takes_logits_processors(engine_args):
        # The constraint processor, by name: the only way vLLM loads it (the project registers
        # no entry point), and only named processors make vLLM fill in real output token IDs
        # under async scheduling (the default), which the processor reads.
        model_json["logits_processors"] = [LOGITS_PROCESSOR, *logits_processors]
    config = vllm_config(name, number)
    if tool_call_parser:
        config.parameters[TOOL_CALL_PARSER].string_value = tool_call_parser
    return {
        f"{name}/{CONFIG_FILE}": render_config(config).encode(),
        f"{name}/{number}/{ENGINE_ARGS_FILE}": (
            json.dumps(model_json, indent=2, sort_keys=True) + "\n"
        ).encode(),
    }


# --- the archive ------------------------------------------------------------------------------


def file_entries(files: dict[str, bytes]) -> list[dict[str, Any]]:
    """The manifest's ``files`` list: every member but the manifest, with sha256 and size."""
    return [
        {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for path, data in sorted(files.items())
    ]


def archive_bytes(files: dict[str, bytes], manifest: dict[str, Any]) -> bytes:
    """A byte-for-byte reproducible tar of ``files`` plus the manifest: sorted members, fixed
    times, owners and modes, so the same inputs always give the same digest."""
    manifest_bytes = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
    members = {**files, MANIFEST_NAME: manifest_bytes}
    directories = sorted({str(PurePosixPath(path).parent) for path in members} - {"."})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for directory in directories:
            tar.addfile(_tarinfo(directory + "/", tarfile.DIRTYPE, 0o755))
        for path in sorted(members):
            info = _tarinfo(path, tarfile.REGTYPE, 0o644)
            info.size = len(members[path])
            tar.addfile(info, io.BytesIO(members[path]))
    return buffer.getvalue()


def _tarinfo(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class UnsafePackageError(ValueError):
    """The archive is malformed, hostile or does not match its manifest."""


def _checked_name(name: str) -> PurePosixPath:
    if not name or "\\" in name or "\x00" in name:
        raise UnsafePackageError(f"{name!r}: forbidden character in member name")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafePackageError(f"{name!r}: absolute path")
    if any(part in ("..", ".") for part in path.parts) or not path.parts:
        raise UnsafePackageError(f"{name!r}: '.' or '..' in member name")
    return path


def _check_members(
    members: list[tarfile.TarInfo], max_member_bytes: int, max_total_bytes: int
) -> dict[PurePosixPath, tarfile.TarInfo]:
    seen: dict[PurePosixPath, tarfile.TarInfo] = {}
    total = 0
    for member in members:
        path = _checked_name(member.name.rstrip("/") if member.isdir() else member.name)
        if not (member.isfile() or member.isdir()):
            raise UnsafePackageError(f"{member.name!r}: only files and directories are allowed")
        if path in seen:
            raise UnsafePackageError(f"{member.name!r}: duplicate member")
        if member.size > max_member_bytes:
            raise UnsafePackageError(
                f"{member.name!r}: {member.size} bytes, over {max_member_bytes}"
            )
        total += member.size
        if total > max_total_bytes:
            raise UnsafePackageError(f"package is larger than {max_total_bytes} bytes")
        seen[path] = member
    for path, member in seen.items():
        for parent in path.parents:
            if parent in seen and not seen[parent].isdir():
                raise UnsafePackageError(f"{member.name!r}: its parent {parent} is a file")
    return seen


def _read_manifest(tar: tarfile.TarFile, members: dict[PurePosixPath, tarfile.TarInfo]) -> dict:
    member = members.get(PurePosixPath(MANIFEST_NAME))
    if member is None or not member.isfile():
        raise UnsafePackageError(f"no {MANIFEST_NAME} at the archive root")
    handle = tar.extractfile(member)
    assert handle is not None
    try:
        manifest = json.loads(handle.read())
    except ValueError as exc:
        raise UnsafePackageError(f"{MANIFEST_NAME} is malformed: {exc}") from exc
    files = _manifest_checks(manifest)
    archived = {p for p, m in members.items() if m.isfile() and p != PurePosixPath(MANIFEST_NAME)}
    if missing := sorted(map(str, set(files) - archived)):
        raise UnsafePackageError(f"listed in the manifest but not in the archive: {missing}")
    if unlisted := sorted(map(str, archived - set(files))):
        raise UnsafePackageError(f"in the archive but not listed in the manifest: {unlisted}")
    manifest["_checks"] = files
    return manifest


def _manifest_checks(manifest: Any) -> dict[PurePosixPath, tuple[str, int]]:
    """Return ``{path: (sha256, size)}``, refusing anything but the exact documented shape.

    Strict on purpose: ``int("12")`` or ``True`` as a size, or a format this code does not
    know, means the package was not built by a portal this instance understands.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise UnsafePackageError(f"{MANIFEST_NAME} is malformed: not an object with format 1")
    entries = manifest.get("files")
    if not isinstance(entries, list):
        raise UnsafePackageError(f"{MANIFEST_NAME} is malformed: 'files' is not a list")
    checks: dict[PurePosixPath, tuple[str, int]] = {}
    for entry in entries:
        fields = entry if isinstance(entry, dict) else {}
        path, digest, size = fields.get("path"), fields.get("sha256"), fields.get("size")
        if (
            not isinstance(path, str)
            or not isinstance(digest, str)
            or not SHA256_HEX.fullmatch(digest)
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
        ):
            raise UnsafePackageError(f"{MANIFEST_NAME} is malformed: bad file entry {entry!r}")
        key = PurePosixPath(path)
        if key in checks:
            raise UnsafePackageError(f"{MANIFEST_NAME} is malformed: {path!r} listed twice")
        checks[key] = (digest, size)
    return checks


def _fsync_dir(path: str | Path) -> None:
    """Make a directory's entries durable: the rename must never expose a missing file."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, destination: Path) -> str:
    """Copy one regular member to a new file, never following a link; return its sha256."""
    source = tar.extractfile(member)
    assert source is not None
    digest = hashlib.sha256()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(destination, flags, 0o644)
    os.fchmod(fd, 0o644)  # the process umask must not decide what Triton can read
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def extract_package(
    archive: Path,
    target: Path,
    *,
    max_member_bytes: int = 64 * 2**20,
    max_total_bytes: int = 256 * 2**20,
) -> dict[str, Any]:
    """Verify and unpack ``archive`` into the new directory ``target``; return the manifest.

    Raises :class:`UnsafePackageError` naming the member and the problem; ``target`` then does
    not exist, and nothing was written anywhere but a staging directory beside it.
    """
    target = Path(target)
    if target.exists() or target.is_symlink():
        raise UnsafePackageError(f"{target} already exists; unpack into a new directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with tarfile.open(archive, mode="r:") as tar:
            members = _check_members(tar.getmembers(), max_member_bytes, max_total_bytes)
            manifest = _read_manifest(tar, members)
            checks = manifest.pop("_checks")
            for path in sorted(members, key=lambda p: len(p.parts)):
                member = members[path]
                destination = staging.joinpath(*path.parts)
                destination.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                if member.isdir():
                    destination.mkdir(mode=0o755, exist_ok=True)
                    continue
                digest = _write_member(tar, member, destination)
                if path == PurePosixPath(MANIFEST_NAME):
                    continue
                expected_digest, expected_size = checks[path]
                if member.size != expected_size:
                    raise UnsafePackageError(
                        f"{member.name!r}: {member.size} bytes, manifest says {expected_size}"
                    )
                if digest != expected_digest:
                    raise UnsafePackageError(f"{member.name!r}: sha256 does not match the manifest")
        # mkdtemp makes staging 0o700 and mkdir obeys the umask: set 0o755 everywhere, then
        # flush every directory bottom-up so the rename publishes a complete tree.
        for directory, _, _ in os.walk(staging, topdown=False):
            os.chmod(directory, 0o755)
            _fsync_dir(directory)
        # rename() silently replaces an *empty* directory: re-check just before it.
        if target.exists() or target.is_symlink():
            raise UnsafePackageError(f"{target} appeared during unpacking; not overwriting it")
        os.rename(staging, target)  # atomic on one filesystem: all or nothing is visible
    except tarfile.TarError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UnsafePackageError(f"not a readable tar archive: {exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(target.parent)  # make the rename itself durable
    return manifest
