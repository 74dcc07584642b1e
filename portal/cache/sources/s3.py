"""``s3://bucket/prefix``: every object under the prefix, fetched as parallel ranged GETs.

Credentials, region and endpoint come from the environment the way boto3 reads them
(``AWS_ACCESS_KEY_ID``…, ``AWS_ENDPOINT_URL_S3`` for any S3-compatible store), never from the
database. Each file is preallocated and its byte ranges written in place by a bounded thread pool;
a journal next to it records finished ranges, so a killed worker's successor fetches only the
rest. Every ranged GET carries ``If-Match`` with the ETag seen at listing time: an object that
changes mid-copy fails loudly instead of mixing two versions' bytes.
"""

from __future__ import annotations

import base64
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from portal.cache.progress import Progress
from portal.cache.sources import CopyOptions, Source, SourceError, SourceFile
from portal.cache.store import Staging, UnsafePath, safe_relpath

READ_CHUNK = 1024 * 1024

#: User metadata some upload tools set with the object's sha256; checked when present.
SHA256_METADATA = "sha256"


def s3_client(parallelism: int = 8) -> Any:
    config = Config(
        retries={"max_attempts": 8, "mode": "adaptive"},
        max_pool_connections=max(10, parallelism + 2),
        connect_timeout=10,
        read_timeout=60,
    )
    return boto3.session.Session().client("s3", config=config)


def _explain(exc: ClientError, where: str) -> SourceError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("NoSuchKey", "404", "NotFound"):
        return SourceError(f"{where} does not exist (it was deleted or renamed during the copy).")
    if code == "NoSuchBucket":
        return SourceError(f"{where}: the bucket does not exist.")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return SourceError(
            f"Access denied to {where}: give the workers' credentials (AWS_* environment) "
            "s3:ListBucket and s3:GetObject on it."
        )
    if code in ("PreconditionFailed", "412") or status == 412:
        return SourceError(f"{where} changed while it was being copied; register it again.")
    return SourceError(f"S3 error on {where}: {code or status} {error.get('Message', '')}".strip())


class _Retryable(Exception):
    """A connection that broke mid-body: botocore retries requests, not half-read bodies."""


class S3Source(Source):
    def __init__(self, uri: str, *, bucket: str, prefix: str, client: Any = None) -> None:
        self.uri = uri
        self.bucket = bucket
        self.prefix = prefix.rstrip("/") + "/" if prefix else ""
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def list_files(self) -> list[SourceFile]:
        files = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if key.endswith("/"):
                        continue  # a "directory" marker
                    try:
                        rel = safe_relpath(key[len(self.prefix) :])
                    except UnsafePath as exc:
                        raise SourceError(f"Refusing s3://{self.bucket}/{key}: {exc}") from exc
                    files.append(self._describe(key, rel, int(obj["Size"])))
        except ClientError as exc:
            raise _explain(exc, f"s3://{self.bucket}/{self.prefix}") from exc
        except BotoCoreError as exc:
            raise SourceError(f"Cannot reach S3 for {self.uri}: {exc}") from exc
        if not files:
            raise SourceError(f"No objects under {self.uri}.")
        return files

    def _describe(self, key: str, rel: str, size: int) -> SourceFile:
        """Ask for the checksums S3 keeps for this object: a full-object SHA-256 checksum, the
        ``sha256`` user metadata, and the ETag, an MD5 of the bytes (or, for a multipart
        upload, of its parts' MD5s: then the first part's size, asked with ``PartNumber=1``,
        says how to recompute it)."""
        where = f"s3://{self.bucket}/{key}"
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            etag = head.get("ETag", "").strip('"')
            md5, part_size = _etag_md5(etag), 0
            if md5 and "-" in md5 and int(md5.rsplit("-", 1)[1]) > 1:
                first = self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)
                part_size = int(first["ContentLength"])
            elif md5 and "-" in md5:  # one part: the part's MD5 is the object's
                part_size = size
        except ClientError as exc:
            raise _explain(exc, where) from exc
        sha256 = None
        if head.get("ChecksumSHA256") and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            raw = head["ChecksumSHA256"]
            if "-" not in raw:
                sha256 = base64.b64decode(raw).hex()
        meta = head.get("Metadata", {}).get(SHA256_METADATA)
        if meta:
            sha256 = meta.lower()
        return SourceFile(
            path=rel,
            size=size,
            locator=key,
            sha256=sha256,
            md5=md5,
            md5_part_size=part_size,
            extra={"etag": etag},
        )

    def fetch(
        self, file: SourceFile, staging: Staging, progress: Progress, options: CopyOptions
    ) -> str | None:
        dest = staging.file(file.path)
        journal = staging.part_journal(file.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        journal.parent.mkdir(parents=True, exist_ok=True)
        part_size = options.part_size
        count = max(1, -(-file.size // part_size))
        done = _read_journal(journal, count, part_size) if dest.exists() else set()
        if not done:
            journal.unlink(missing_ok=True)
            journal.write_text(f"# part_size {part_size}\n")
        reused = sum(_part_len(i, part_size, file.size) for i in done)
        progress.add(reused, fetched=False)

        fd = os.open(dest, os.O_RDWR | os.O_CREAT, 0o644)
        journal_lock = threading.Lock()
        stop = threading.Event()
        try:
            os.ftruncate(fd, file.size)
            with journal.open("a") as journal_file:

                def fetch_part(index: int) -> None:
                    if stop.is_set():
                        return
                    self._fetch_range(file, fd, index, part_size, progress, options, stop)
                    with journal_lock:
                        journal_file.write(f"{index}\n")
                        journal_file.flush()

                todo = [i for i in range(count) if i not in done]
                with ThreadPoolExecutor(max_workers=max(1, options.parallelism)) as pool:
                    futures = [pool.submit(fetch_part, i) for i in todo]
                    finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                    stop.set()
                    for future in futures:
                        future.cancel()
                    for future in finished:
                        if future.exception() is not None:
                            raise future.exception()  # type: ignore[misc]
            os.fsync(fd)
        finally:
            os.close(fd)
        return None

    def _fetch_range(
        self,
        file: SourceFile,
        fd: int,
        index: int,
        part_size: int,
        progress: Progress,
        options: CopyOptions,
        stop: threading.Event,
    ) -> None:
        start = index * part_size
        length = _part_len(index, part_size, file.size)
        if length == 0:
            return
        where = f"s3://{self.bucket}/{file.locator}"

        @retry(
            retry=retry_if_exception_type(_Retryable),
            stop=stop_after_attempt(5),
            wait=wait_exponential(multiplier=0.5, max=10),
            reraise=True,
        )
        def attempt() -> None:
            written = 0
            try:
                request: dict[str, Any] = {
                    "Bucket": self.bucket,
                    "Key": file.locator,
                    "Range": f"bytes={start}-{start + length - 1}",
                }
                if file.extra.get("etag"):
                    request["IfMatch"] = f'"{file.extra["etag"]}"'
                body = self.client.get_object(**request)["Body"]
                while written < length:
                    if stop.is_set():
                        raise SourceError("stopped")
                    chunk = body.read(min(READ_CHUNK, length - written))
                    if not chunk:
                        raise _Retryable(f"{where}: connection closed early")
                    options.throttle.consume(len(chunk))
                    os.pwrite(fd, chunk, start + written)
                    written += len(chunk)
                    progress.add(len(chunk))
            except ClientError as exc:
                progress.undo(written)
                raise _explain(exc, where) from exc
            except (BotoCoreError, OSError) as exc:
                progress.undo(written)
                if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
                    raise
                raise _Retryable(f"{where}: {exc}") from exc
            except _Retryable:
                progress.undo(written)
                raise

        try:
            attempt()
        except _Retryable as exc:
            raise SourceError(f"Copy of {where} kept failing: {exc}") from exc


def _etag_md5(etag: str) -> str | None:
    """The ETag when it is an MD5 (``<32 hex>`` or ``<32 hex>-<parts>``); SSE-KMS objects and
    some S3-compatible stores give other ETags, which say nothing checkable."""
    digest, _, parts = etag.partition("-")
    if len(digest) != 32 or any(c not in "0123456789abcdef" for c in digest.lower()):
        return None
    if parts and not parts.isdigit():
        return None
    return etag.lower()


def _part_len(index: int, part_size: int, size: int) -> int:
    return max(0, min(part_size, size - index * part_size))


def _read_journal(journal, count: int, part_size: int) -> set[int]:
    """Ranges an earlier attempt finished; none if it used another part size."""
    try:
        lines = journal.read_text().splitlines()
    except FileNotFoundError:
        return set()
    if not lines or lines[0] != f"# part_size {part_size}":
        return set()
    done = set()
    for line in lines[1:]:
        if line.strip().isdigit() and int(line) < count:
            done.add(int(line))
    return done
