"""Unpacking model packages: hostile archives never write outside the staging area."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.package import UnsafePackageError, extract_package


@pytest.fixture
def here(tmp_path) -> Path:
    """A directory of this test's own (tmp_path also holds other fixtures' files)."""
    path = tmp_path / "unpack"
    path.mkdir()
    return path


GOOD = {"m/config.pbtxt": b'backend: "vllm"\n', "m/1/model.json": b'{"dtype": "auto"}\n'}


def manifest_of(files: dict[str, bytes]) -> bytes:
    entries = [
        {"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
        for p, d in sorted(files.items())
    ]
    return json.dumps({"format": 1, "files": entries}).encode()


def archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def pax_named(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    """A name only a PAX record can carry (a ustar field stops at the first NUL)."""
    info = tarfile.TarInfo("placeholder")
    info.pax_headers = {"path": name}
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def good_members(files=GOOD, manifest: bytes | None = None):
    members = [regular(p, d) for p, d in files.items()]
    return [
        *members,
        regular("manifest.json", manifest_of(files) if manifest is None else manifest),
    ]


def bad_entry(duplicate: bool = False, **override) -> bytes:
    """The GOOD manifest with its first entry's fields overridden (or listed twice)."""
    manifest = json.loads(manifest_of(GOOD))
    manifest["files"][0].update(override)
    if duplicate:
        manifest["files"].append(manifest["files"][0])
    return json.dumps(manifest).encode()


def test_good_package_round_trips(here):
    target = here / "out"
    manifest = extract_package(archive(here / "p.tar", good_members()), target)
    assert [e["path"] for e in manifest["files"]] == sorted(GOOD)
    for path, data in GOOD.items():
        assert (target / path).read_bytes() == data
    assert sorted(p.name for p in here.iterdir()) == ["out", "p.tar"]  # no staging left


def test_portal_built_package_unpacks(here):
    """The packaging code's archive format and this extractor agree."""
    from serving.package import archive_bytes

    files = {"team--m/config.pbtxt": b'name: "team--m"\n', "team--m/3/model.json": b"{}\n"}
    manifest = json.loads(manifest_of(files))
    (here / "p.tar").write_bytes(archive_bytes(files, manifest))
    extract_package(here / "p.tar", here / "out")
    assert (here / "out/team--m/3/model.json").read_bytes() == b"{}\n"


HOSTILE = {
    "parent traversal": ([regular("../../etc/x", b"x")], "'..'"),
    "absolute path": ([regular("/etc/passwd", b"x")], "absolute"),
    "inner traversal": ([regular("a/../../x", b"x")], "'..'"),
    "backslash": ([regular("a\\..\\x", b"x")], "forbidden character"),
    "NUL in a PAX path": ([pax_named("m/a\x00b", b"x")], "forbidden character"),
    "symlink out": (
        [special("m/link", tarfile.SYMTYPE, "/etc/passwd")],
        "only files and directories",
    ),
    "dir symlink then file": (
        [special("m/d", tarfile.SYMTYPE, "/tmp"), regular("m/d/evil", b"x")],
        "only files and directories",
    ),
    "hard link out": (
        [special("m/h", tarfile.LNKTYPE, "/etc/passwd")],
        "only files and directories",
    ),
    "hard link in": (
        [regular("m/a", b"x"), special("m/h", tarfile.LNKTYPE, "m/a")],
        "only files and directories",
    ),
    "character device": ([special("m/dev", tarfile.CHRTYPE)], "only files and directories"),
    "fifo": ([special("m/fifo", tarfile.FIFOTYPE)], "only files and directories"),
    "duplicate": ([regular("m/a", b"x"), regular("m/a", b"y")], "duplicate"),
    "file as parent": ([regular("m", b"x"), regular("m/a", b"y")], "is a file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_refused(here, case):
    members, message = HOSTILE[case]
    path = archive(here / "p.tar", [*members, regular("manifest.json", manifest_of({}))])
    with pytest.raises(UnsafePackageError, match=message):
        extract_package(path, here / "out")
    assert sorted(p.name for p in here.iterdir()) == ["p.tar"]


@pytest.mark.parametrize(
    ("members", "kwargs", "message"),
    [
        (good_members(), {"max_member_bytes": 10}, "over 10"),
        (good_members(), {"max_total_bytes": 20}, "larger than 20"),
        ([regular(p, d) for p, d in GOOD.items()], {}, "no manifest.json"),
        (good_members(manifest=b"not json"), {}, "malformed"),
        (good_members(manifest=b'{"files": [{"path": "x"}]}'), {}, "malformed"),
        (good_members(manifest=b'{"format": 2, "files": []}'), {}, "format 1"),
        (good_members(manifest=b"[]"), {}, "format 1"),
        (good_members(manifest=bad_entry(size="16")), {}, "bad file entry"),
        (good_members(manifest=bad_entry(size=True)), {}, "bad file entry"),
        (good_members(manifest=bad_entry(size=-1)), {}, "bad file entry"),
        (good_members(manifest=bad_entry(sha256="ABC")), {}, "bad file entry"),
        (good_members(manifest=bad_entry(path=None)), {}, "bad file entry"),
        (good_members(manifest=bad_entry(duplicate=True)), {}, "listed twice"),
        (good_members(manifest=manifest_of({**GOOD, "m/extra": b"1"})), {}, "not in the archive"),
        (
            good_members(manifest=manifest_of({"m/config.pbtxt": GOOD["m/config.pbtxt"]})),
            {},
            "not listed",
        ),
        (
            good_members(manifest=manifest_of({**GOOD, "m/1/model.json": b'{"dtype": "half"}\n'})),
            {},
            "sha256 does not match",
        ),
        (
            good_members(manifest=manifest_of({**GOOD, "m/1/model.json": b"{}"})),
            {},
            "manifest says",
        ),
    ],
)
def test_bad_packages_are_refused(here, members, kwargs, message):
    with pytest.raises(UnsafePackageError, match=message):
        extract_package(archive(here / "p.tar", members), here / "out", **kwargs)
    assert sorted(p.name for p in here.iterdir()) == ["p.tar"]


def test_existing_target_is_never_overwritten(here):
    (here / "out").mkdir()
    (here / "out" / "keep").write_text("mine")
    with pytest.raises(UnsafePackageError, match="already exists"):
        extract_package(archive(here / "p.tar", good_members()), here / "out")
    assert (here / "out" / "keep").read_text() == "mine"


def test_modes_do_not_depend_on_the_umask(here):
    """Directories 0o755 and files 0o644, even under umask 077 (mkdtemp alone gives 0o700)."""
    old = os.umask(0o077)
    try:
        extract_package(archive(here / "p.tar", good_members()), here / "out")
    finally:
        os.umask(old)
    modes = {
        str(p.relative_to(here)): stat.S_IMODE(p.stat().st_mode)
        for p in [here / "out", *(here / "out").rglob("*")]
    }
    assert modes == {
        "out": 0o755,
        "out/m": 0o755,
        "out/m/1": 0o755,
        "out/manifest.json": 0o644,
        "out/m/config.pbtxt": 0o644,
        "out/m/1/model.json": 0o644,
    }


def test_target_created_during_unpacking_is_not_replaced(here, monkeypatch):
    """rename() would silently replace an empty directory; the last-moment re-check refuses."""
    import serving.package as package

    real_fsync_dir = package._fsync_dir

    def fsync_then_race(path):
        real_fsync_dir(path)
        if Path(path).name.startswith(".out."):  # the staging root: the last one before rename
            (here / "out").mkdir()

    monkeypatch.setattr(package, "_fsync_dir", fsync_then_race)
    with pytest.raises(UnsafePackageError, match="appeared during unpacking"):
        extract_package(archive(here / "p.tar", good_members()), here / "out")
    assert sorted(p.name for p in here.iterdir()) == ["out", "p.tar"]
    assert list((here / "out").iterdir()) == []


def test_not_a_tar_archive(here):
    (here / "p.tar").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(UnsafePackageError, match="not a readable tar archive"):
        extract_package(here / "p.tar", here / "out")


# --- property: whatever the archive, nothing lands outside the target ------------------------

NAME_PARTS = st.sampled_from(
    ["m", "a", "..", ".", "", "etc", "x\\y", "/", "/etc", "1", "config.pbtxt"]
)
NAMES = st.lists(NAME_PARTS, min_size=1, max_size=4).map("/".join)
KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE])


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entries=st.lists(st.tuples(NAMES, KINDS, NAMES, st.binary(max_size=8)), max_size=6),
    list_in_manifest=st.booleans(),
)
def test_nothing_escapes_the_target(tmp_path_factory, entries, list_in_manifest):
    root = tmp_path_factory.mktemp("prop")
    work, sentinel = root / "work", root / "sentinel"
    work.mkdir()
    sentinel.mkdir()
    (sentinel / "keep").write_text("untouched")
    members, files = [], {}
    for name, kind, link, data in entries:
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            info.linkname = str(sentinel / link) if link.startswith("/") else link
            members.append((info, None))
        elif kind == tarfile.DIRTYPE:
            members.append((info, None))
        else:
            members.append((info, data))
            files[name] = data
    if list_in_manifest:
        members.append(regular("manifest.json", manifest_of(files)))
    path = archive(root / "p.tar", members)
    target = work / "out"
    try:
        manifest = extract_package(path, target)
    except UnsafePackageError:
        assert not target.exists()
    else:
        for entry in manifest["files"]:
            assert (
                hashlib.sha256((target / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
            )
        for found in target.rglob("*"):
            assert not found.is_symlink()
            assert found.resolve().is_relative_to(target.resolve())
    assert sorted(p.name for p in work.iterdir()) in ([], ["out"])
    assert [p.name for p in sentinel.iterdir()] == ["keep"]
    assert (sentinel / "keep").read_text() == "untouched"
    assert sorted(p.name for p in root.iterdir()) == ["p.tar", "sentinel", "work"]
