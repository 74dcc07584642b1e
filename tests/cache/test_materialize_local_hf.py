"""Materializing from local files (under the allowed roots) and from a Hugging Face Hub cache
laid out on disk as the Hub lays it out, with the library in offline mode: never the real Hub."""

from __future__ import annotations

import hashlib
import os

import pytest

from portal.cache import services
from portal.cache.models import Materialization
from portal.cache.store import UnsafePath, safe_relpath
from portal.registry.models import VersionState
from portal.registry.packaging import weights_dir
from tests.factories import make_model, make_version

pytestmark = pytest.mark.django_db(transaction=True)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "name", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "", "a\\b", ".materialized.json"]
)
def test_unsafe_names_are_refused(name):
    with pytest.raises(UnsafePath):
        safe_relpath(name)


def test_safe_names_pass():
    assert safe_relpath("tokenizer/tokenizer.json") == "tokenizer/tokenizer.json"
    assert safe_relpath("model-00001-of-00002.safetensors") == "model-00001-of-00002.safetensors"


def test_local_directory_is_copied_and_verified(worker_cache, artifact_root, team, release):
    source = artifact_root / "tiny"
    (source / "tokenizer").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(os.urandom(3 * 1024 * 1024))
    (source / "tokenizer" / "tokenizer.json").write_text('{"v": 1}')
    version = make_version(make_model(team), artifact_root, artifact_uri=f"file://{source}")

    assert services.materialize(version.pk) == "materialized"

    tree = weights_dir(version)
    for name in ("config.json", "model.safetensors", "tokenizer/tokenizer.json"):
        assert (tree / name).read_bytes() == (source / name).read_bytes()
        assert not os.access(tree / name, os.W_OK) or os.geteuid() == 0  # blobs are read-only
        assert (tree / name).stat().st_mode & 0o222 == 0
    record = Materialization.objects.get(version=version)
    assert record.files_done == 3 and record.bytes_done == record.bytes_total


def test_a_symlink_out_of_the_artifact_roots_is_refused(
    worker_cache, artifact_root, tmp_path, team, release
):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy")
    source = artifact_root / "sneaky"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "leak.txt").symlink_to(secret)
    version = make_version(make_model(team), artifact_root, artifact_uri=f"file://{source}")

    assert services.materialize(version.pk) == "failed"
    version.refresh_from_db()
    assert "links outside the allowed artifact roots" in version.failure_reason
    assert not weights_dir(version).exists()


def hub_snapshot(cache_dir, repo: str, files: dict[str, bytes], *, corrupt: str = "") -> None:
    """A Hub cache entry as huggingface_hub writes it: blobs named by their sha256 (LFS files)
    or git blob id (small files), a snapshot of symlinks, and a ref naming the commit."""
    root = cache_dir / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    for name, data in files.items():
        if name.endswith(".safetensors"):
            blob_name = hashlib.sha256(data).hexdigest()
        else:
            blob_name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (root / "blobs" / blob_name).write_bytes(data if name != corrupt else data[::-1])
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / "blobs" / blob_name, link.parent))


@pytest.fixture
def offline_hub(worker_cache, monkeypatch, settings):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return settings.HF_HUB_CACHE_DIR


HUB_FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": os.urandom(2 * 1024 * 1024),
    "tokenizer.json": b'{"version": "1.0"}',
    "pytorch_model.bin": b"pickle: never copied",
    "README.md": b"# not a weight",
}


def test_hub_source_copies_weights_config_and_tokenizer_at_a_pinned_commit(
    offline_hub, team, release
):
    hub_snapshot(offline_hub, "acme/tiny", HUB_FILES)
    version = make_version(make_model(team), offline_hub, artifact_uri="hf://acme/tiny@main")

    assert services.materialize(version.pk) == "materialized"

    tree = weights_dir(version)
    copied = sorted(p.name for p in tree.iterdir() if p.name != ".materialized.json")
    assert copied == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (tree / "model.safetensors").read_bytes() == HUB_FILES["model.safetensors"]
    assert Materialization.objects.get(version=version).source_revision == COMMIT


def test_hub_file_that_does_not_match_its_hash_fails(offline_hub, team, release):
    hub_snapshot(offline_hub, "acme/broken", HUB_FILES, corrupt="tokenizer.json")
    version = make_version(make_model(team), offline_hub, artifact_uri="hf://acme/broken")

    assert services.materialize(version.pk) == "failed"
    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert "Checksum mismatch for tokenizer.json" in version.failure_reason
    assert "git blob id" in version.failure_reason
    assert not weights_dir(version).exists()


def test_hub_repo_missing_offline_is_explained(offline_hub, team, release):
    version = make_version(make_model(team), offline_hub, artifact_uri="hf://acme/absent@v2")
    assert services.materialize(version.pk) == "failed"
    version.refresh_from_db()
    assert "not in the worker's Hub cache" in version.failure_reason


def test_an_unusable_cache_volume_fails_with_the_reason(
    worker_cache, artifact_root, tmp_path, settings, team, release
):
    source = artifact_root / "m"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (tmp_path / "not-a-dir").write_text("")
    settings.MODEL_CACHE_ROOT = tmp_path / "not-a-dir" / "cache"
    version = make_version(make_model(team), artifact_root, artifact_uri=f"file://{source}")

    assert services.materialize(version.pk) == "failed"
    version.refresh_from_db()
    assert version.failure_reason.startswith("Cannot write the model cache (")
    assert "Not a directory" in version.failure_reason
