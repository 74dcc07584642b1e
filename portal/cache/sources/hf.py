"""``hf://org/name@revision``: the weights, config and tokenizer files of a Hub repository.

``huggingface_hub.snapshot_download`` fetches them (resumable, parallel, honouring ``HF_TOKEN``,
``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``) into the worker's Hub cache; they are then copied into
the model cache and checked against the names the Hub cache stores them by: the sha256 for
large (LFS) files, the git blob id for small ones. The commit the revision resolved to is
recorded, so "main" today and "main" next week are told apart.

Pickled PyTorch weights (``*.bin``, ``*.pt``) are not copied: loading them runs code, and the
platform serves safetensors.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.conf import settings

from portal.cache.progress import Progress
from portal.cache.sources import CopyOptions, Source, SourceError, SourceFile, copy_file
from portal.cache.store import Staging, UnsafePath, safe_relpath

ALLOW_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "*.json",
    "*.model",  # sentencepiece
    "*.tiktoken",
    "*.txt",  # merges.txt, vocab.txt
    "*.jinja",  # chat templates
]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_GIT_SHA1 = re.compile(r"^[0-9a-f]{40}$")


class HubSource(Source):
    def __init__(self, uri: str, *, repo_id: str, revision: str) -> None:
        self.uri = uri
        self.repo_id = repo_id
        self.requested_revision = revision
        self.revision = ""
        self.snapshot: Path | None = None

    def list_files(self) -> list[SourceFile]:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"{self.repo_id}@{self.requested_revision}"
        try:
            path = snapshot_download(
                self.repo_id,
                revision=self.requested_revision,
                allow_patterns=ALLOW_PATTERNS,
                cache_dir=settings.HF_HUB_CACHE_DIR,
            )
        except GatedRepoError as exc:
            raise SourceError(
                f"{where} is gated: accept its terms on the Hub and give the workers an HF_TOKEN."
            ) from exc
        except RepositoryNotFoundError as exc:
            raise SourceError(
                f"{where} does not exist or is private (set HF_TOKEN for private ones)."
            ) from exc
        except RevisionNotFoundError as exc:
            raise SourceError(f"{where}: no such revision.") from exc
        except LocalEntryNotFoundError as exc:
            raise SourceError(
                f"{where} is not in the worker's Hub cache and the Hub cannot be reached "
                "(HF_HUB_OFFLINE or no network)."
            ) from exc
        self.snapshot = Path(path)
        self.revision = self.snapshot.name  # snapshots/<commit>
        files = []
        for dirpath, dirnames, names in os.walk(self.snapshot):
            dirnames.sort()
            for name in sorted(names):
                full = Path(dirpath, name)
                try:
                    rel = safe_relpath(full.relative_to(self.snapshot).as_posix())
                except UnsafePath as exc:
                    raise SourceError(str(exc)) from exc
                if not any(full.match(p) for p in ALLOW_PATTERNS):
                    continue
                blob = full.resolve()  # the Hub cache names blobs by their hash
                digest = blob.name
                files.append(
                    SourceFile(
                        path=rel,
                        size=blob.stat().st_size,
                        locator=str(blob),
                        sha256=digest if _SHA256.match(digest) else None,
                        git_sha1=digest if _GIT_SHA1.match(digest) else None,
                    )
                )
        if not files:
            raise SourceError(f"{where} has no weights, config or tokenizer files.")
        return files

    def fetch(
        self, file: SourceFile, staging: Staging, progress: Progress, options: CopyOptions
    ) -> str | None:
        return copy_file(file.locator, staging.file(file.path), progress, options)
