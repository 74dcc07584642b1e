"""The on-disk cache without Django: blobs shared by hard links, atomic publish, garbage
collection by link count, the copier's failure paths."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from portal.cache.filecopy import copy_file
from portal.cache.materializer import check_space
from portal.cache.progress import Progress, Throttle
from portal.cache.sources import SourceError
from portal.cache.store import MANIFEST_NAME, ContentStore, LedgerEntry


def staged(store: ContentStore, key: str, name: str, data: bytes) -> Path:
    path = store.staging(key).file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_adopt_stores_identical_files_once(tmp_path):
    store = ContentStore(tmp_path)
    digest = hashlib.sha256(b"weights").hexdigest()
    first = staged(store, "a", "w.bin", b"weights")
    second = staged(store, "b", "w.bin", b"weights")
    store.adopt(first, digest)
    store.adopt(second, digest)
    assert first.stat().st_ino == second.stat().st_ino == store.blob_path(digest).stat().st_ino
    assert store.blob_path(digest).stat().st_nlink == 3
    assert store.usage().blob_count == 1


def test_publish_is_one_rename_and_a_second_publish_defers_to_the_first(tmp_path):
    store = ContentStore(tmp_path)
    for key in ("a", "b"):
        path = staged(store, key, "config.json", b"{}")
        store.adopt(path, hashlib.sha256(b"{}").hexdigest())
    assert store.manifest("models/t/m/1") is None
    assert store.publish(store.staging("a"), "models/t/m/1", {"files": ["a"]}) is True
    assert store.publish(store.staging("b"), "models/t/m/1", {"files": ["b"]}) is False
    assert store.manifest("models/t/m/1") == {"files": ["a"]}
    assert (store.tree("models/t/m/1") / MANIFEST_NAME).is_file()
    assert not store.staging("a").path.exists() and not store.staging("b").path.exists()


def test_garbage_collection_frees_only_blobs_no_tree_links(tmp_path):
    store = ContentStore(tmp_path)
    kept, dropped = b"kept", b"dropped"
    for key, data in (("a", kept), ("b", dropped)):
        store.adopt(staged(store, key, "f", data), hashlib.sha256(data).hexdigest())
        store.publish(store.staging(key), f"models/t/m/{key}", {})
    store.remove_tree("models/t/m/b")
    assert store.collect_garbage() == len(dropped)
    assert store.blob_path(hashlib.sha256(kept).hexdigest()).is_file()
    assert not store.blob_path(hashlib.sha256(dropped).hexdigest()).exists()
    assert (store.tree("models/t/m/a") / "f").read_bytes() == kept


def test_ledger_ignores_torn_lines_and_unlinked_files(tmp_path):
    store = ContentStore(tmp_path)
    staging = store.staging("v")
    digest = hashlib.sha256(b"x").hexdigest()
    store.adopt(staged(store, "v", "x", b"x"), digest)
    staging.record(LedgerEntry("x", digest, 1))
    staging.record(LedgerEntry("gone", "00" * 32, 5))
    with staging.ledger_path.open("a") as ledger:
        ledger.write('{"path": "half')  # a worker killed mid-line
    assert list(staging.ledger()) == ["x"]


def test_copy_file_hashes_what_it_writes(tmp_path):
    src = tmp_path / "src"
    data = os.urandom(20 * 1024 * 1024 + 17)
    src.write_bytes(data)
    progress = Progress()
    digest = copy_file(src, tmp_path / "out" / "dst", progress, Throttle(0))
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "out" / "dst").read_bytes() == data
    assert progress.snapshot()["bytes_done"] == len(data)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_copy_file_reports_a_full_disk_without_hanging(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(os.urandom(40 * 1024 * 1024))
    with pytest.raises(OSError) as raised:
        copy_file(src, Path("/dev/full"), Progress())
    assert raised.value.errno == errno.ENOSPC


def test_not_enough_space_is_a_reason_a_human_can_act_on(tmp_path):
    with pytest.raises(SourceError, match=r"Disk full: the model cache at .* GiB free"):
        check_space(tmp_path, 10**18)
