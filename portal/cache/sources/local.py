"""``file:///path``: a directory (or one file) under ``ARTIFACT_FILE_ROOTS``."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from portal.cache.progress import Progress
from portal.cache.sources import CopyOptions, Source, SourceError, SourceFile, copy_file
from portal.cache.store import Staging, UnsafePath, safe_relpath


def _inside_roots(path: Path) -> bool:
    return any(path == root or root in path.parents for root in settings.ARTIFACT_FILE_ROOTS)


class LocalSource(Source):
    def __init__(self, uri: str, path: Path) -> None:
        self.uri = uri
        self.path = path

    def list_files(self) -> list[SourceFile]:
        # Resolve first: a symlink inside a root may point anywhere, so the real path is checked.
        real = self.path.resolve()
        if not _inside_roots(real):
            allowed = ", ".join(str(r) for r in settings.ARTIFACT_FILE_ROOTS)
            raise SourceError(f"{self.path} is outside the allowed artifact roots ({allowed}).")
        if real.is_file():
            return [SourceFile(path=real.name, size=real.stat().st_size, locator=str(real))]
        if not real.is_dir():
            raise SourceError(f"{self.path} does not exist on the worker.")
        files = []
        for dirpath, dirnames, names in os.walk(real):
            dirnames.sort()
            for name in sorted(names):
                full = Path(dirpath, name)
                target = full.resolve()
                if not _inside_roots(target):
                    raise SourceError(f"{full} links outside the allowed artifact roots.")
                if not target.is_file():
                    continue
                try:
                    rel = safe_relpath(full.relative_to(real).as_posix())
                except UnsafePath as exc:
                    raise SourceError(str(exc)) from exc
                files.append(SourceFile(path=rel, size=target.stat().st_size, locator=str(target)))
        if not files:
            raise SourceError(f"{self.path} holds no files.")
        return files

    def fetch(
        self, file: SourceFile, staging: Staging, progress: Progress, options: CopyOptions
    ) -> str | None:
        try:
            return copy_file(file.locator, staging.file(file.path), progress, options)
        except FileNotFoundError as exc:
            raise SourceError(f"{file.locator} disappeared during the copy.") from exc
