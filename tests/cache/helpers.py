"""What the model cache's tests share: random file contents, uploading them to a bucket, and
reading back a materialized version's tree."""

from __future__ import annotations

import random

from portal.registry.packaging import weights_dir
from tests.cache.conftest import BUCKET

MiB = 1024 * 1024


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def upload(client, prefix: str, files: dict[str, bytes], **extra) -> str:
    """Put ``files`` under ``prefix`` in the test bucket; returns the version's ``s3://`` URI."""
    for name, data in files.items():
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=data, **extra)
    return f"s3://{BUCKET}/{prefix}"


def tree_files(version) -> dict[str, bytes]:
    """A materialized version's files (its tree in the cache), by path, manifest left out."""
    root = weights_dir(version)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".materialized.json"
    }
