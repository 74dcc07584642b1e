"""``portal.cache.filecopy``: both paths hash the bytes they write, report progress, honour the
throttle, and a source changed during the kernel copy does not yield a digest of other bytes."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

import pytest

from portal.cache import filecopy
from portal.cache.filecopy import copy_file
from portal.cache.progress import Progress, Throttle

MiB = 1024 * 1024


@pytest.fixture
def settled(monkeypatch):
    """Take the kernel path for files the test has just written."""
    monkeypatch.setattr(filecopy, "SETTLED_NS", -(10**12))


@pytest.fixture
def paths(monkeypatch):
    """Record which path each copy took."""
    taken: list[str] = []
    for name in ("_copy_kernel", "_copy_chunked"):
        real = getattr(filecopy, name)

        def spy(*args, _real=real, _name=name):
            taken.append(_name)
            return _real(*args)

        monkeypatch.setattr(filecopy, name, spy)
    return taken


def write(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def check(src: Path, dest: Path, data: bytes, throttle: Throttle | None = None) -> Progress:
    progress = Progress()
    digest = copy_file(src, dest, progress, throttle)
    assert dest.read_bytes() == data
    assert digest == hashlib.sha256(dest.read_bytes()).hexdigest()
    assert progress.snapshot()["bytes_done"] == len(data)
    return progress


@pytest.mark.parametrize("size", [0, 1, 5 * MiB + 3, filecopy.COPY_BLOCK + filecopy.CHUNK + 7])
def test_kernel_copy_hashes_the_bytes_it_writes(tmp_path, settled, paths, size):
    data = write(tmp_path / "src", size)
    check(tmp_path / "src", tmp_path / "a" / "b" / "dst", data)
    assert paths == ["_copy_kernel"]


@pytest.mark.parametrize("size", [0, filecopy.CHUNK * 2 + 5])
def test_a_just_written_file_takes_the_chunked_path(tmp_path, paths, size):
    data = write(tmp_path / "src", size)
    check(tmp_path / "src", tmp_path / "dst", data)
    assert paths == ["_copy_chunked"]


def test_a_throttle_takes_the_chunked_path_and_is_honoured(tmp_path, settled, paths, monkeypatch):
    data = write(tmp_path / "src", filecopy.CHUNK + 100)
    consumed: list[int] = []
    throttle = Throttle(10**12)
    monkeypatch.setattr(throttle, "consume", consumed.append)
    check(tmp_path / "src", tmp_path / "dst", data, throttle)
    assert paths == ["_copy_chunked"]
    assert sum(consumed) == len(data)


def test_an_unlimited_throttle_keeps_the_kernel_path(tmp_path, settled, paths):
    data = write(tmp_path / "src", 3 * MiB)
    check(tmp_path / "src", tmp_path / "dst", data, Throttle(0))
    assert paths == ["_copy_kernel"]


def test_progress_moves_per_block(tmp_path, settled, monkeypatch):
    monkeypatch.setattr(filecopy, "COPY_BLOCK", MiB)
    write(tmp_path / "src", 4 * MiB + 1)
    seen: list[int] = []
    progress = Progress()
    monkeypatch.setattr(progress, "add", lambda n, **kw: seen.append(n))
    copy_file(tmp_path / "src", tmp_path / "dst", progress)
    assert seen == [MiB] * 4 + [1]


def test_copy_file_range_refused_falls_back_to_sendfile(tmp_path, settled, monkeypatch):
    def refuse(*args):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    data = write(tmp_path / "src", 3 * MiB + 1)
    check(tmp_path / "src", tmp_path / "dst", data)


def test_a_source_changed_during_the_copy_is_rehashed_from_the_destination(
    tmp_path, settled, monkeypatch
):
    """Deterministic: the hasher reads the original bytes, then the source is rewritten (same
    size), then the kernel copy starts, so it copies the new bytes. Trusting the source's hash
    would return the digest of bytes that are not in the destination."""
    src, dest = tmp_path / "src", tmp_path / "dst"
    old = write(src, 2 * MiB)
    new = os.urandom(len(old))
    hashed = threading.Event()
    real_run, real_copy = filecopy._Hasher.run, filecopy._kernel_copy

    def run_then_change(self):
        real_run(self)
        assert self.sha.hexdigest() == hashlib.sha256(old).hexdigest()
        with open(src, "r+b") as file:  # in place: the open descriptor sees it
            file.write(new)
        hashed.set()

    def copy_after_change(*args):
        assert hashed.wait(10)
        return real_copy(*args)

    monkeypatch.setattr(filecopy._Hasher, "run", run_then_change)
    monkeypatch.setattr(filecopy, "_kernel_copy", copy_after_change)
    rehashed: list[Path] = []
    real_hash_file = filecopy._hash_file
    monkeypatch.setattr(filecopy, "_hash_file", lambda p: rehashed.append(p) or real_hash_file(p))

    digest = copy_file(src, dest, Progress())
    assert dest.read_bytes() == new
    assert digest == hashlib.sha256(new).hexdigest()
    assert rehashed == [dest]


def test_an_unchanged_source_is_not_rehashed(tmp_path, settled, monkeypatch):
    monkeypatch.setattr(filecopy, "_hash_file", lambda p: pytest.fail("re-hashed"))
    data = write(tmp_path / "src", MiB)
    check(tmp_path / "src", tmp_path / "dst", data)


def test_a_source_growing_during_the_copy_is_rehashed(tmp_path, settled, monkeypatch):
    src, dest = tmp_path / "src", tmp_path / "dst"
    data = write(src, MiB)
    real_run = filecopy._Hasher.run

    def run_then_append(self):
        real_run(self)
        with open(src, "ab") as file:
            file.write(b"more")

    monkeypatch.setattr(filecopy._Hasher, "run", run_then_append)
    digest = copy_file(src, dest, Progress())
    assert digest == hashlib.sha256(dest.read_bytes()).hexdigest()
    assert dest.read_bytes()[: len(data)] == data


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
@pytest.mark.parametrize("kernel", [True, False])
def test_an_unwritable_destination_raises(tmp_path, monkeypatch, kernel):
    if kernel:
        monkeypatch.setattr(filecopy, "SETTLED_NS", -(10**12))
    write(tmp_path / "src", 2 * MiB)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            copy_file(tmp_path / "src", locked / "dst", Progress())
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_device_destination_falls_back_to_the_chunked_path_and_raises(tmp_path, settled, paths):
    """Neither copy_file_range nor sendfile writes to /dev/full (EINVAL); the chunked path then
    reports the full disk, and the kernel path's hasher has been stopped and joined."""
    write(tmp_path / "src", 3 * filecopy.COPY_BLOCK)
    before = threading.active_count()
    with pytest.raises(OSError) as raised:
        copy_file(tmp_path / "src", Path("/dev/full"), Progress())
    assert raised.value.errno == errno.ENOSPC
    assert paths == ["_copy_kernel", "_copy_chunked"]
    assert threading.active_count() == before


@pytest.mark.parametrize("kernel", [True, False])
def test_a_destination_that_cannot_be_opened_raises(tmp_path, monkeypatch, kernel):
    if kernel:
        monkeypatch.setattr(filecopy, "SETTLED_NS", -(10**12))
    write(tmp_path / "src", 2 * MiB)
    (tmp_path / "dst").mkdir()
    before = threading.active_count()
    with pytest.raises(IsADirectoryError):
        copy_file(tmp_path / "src", tmp_path / "dst", Progress())
    assert threading.active_count() == before


def test_a_destination_under_a_file_raises(tmp_path):
    write(tmp_path / "src", 1)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(FileExistsError):
        copy_file(tmp_path / "src", tmp_path / "file" / "dst", Progress())


def test_a_missing_source_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        copy_file(tmp_path / "absent", tmp_path / "dst", Progress())
