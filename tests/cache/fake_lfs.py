"""A stand-in for Lustre's ``lfs`` HSM commands on a local directory, for the FSx tests.

It behaves as the real client does towards its caller: ``hsm_restore`` returns at once and a
copytool (here a detached process) fills the released file in the background; ``hsm_action``
says ``RESTORE running`` until it is done, then ``NOOP``; ``hsm_state`` says ``released`` until
the contents are all there, and still does after a restore that failed part-way. The bytes come
from an archive directory that mirrors the mount (what S3 holds behind the association).

Usage: ``fake_lfs.py --state DIR --archive DIR --mount DIR <hsm_restore|hsm_action|hsm_state>
PATH...``. ``DIR/fail`` lines ``<file name> <bytes>`` make that file's restore stop after so many
bytes; ``FAKE_LFS_CHUNK`` and ``FAKE_LFS_DELAY`` set how fast the copytool writes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _key(state: Path, path: str) -> Path:
    return state / hashlib.sha1(os.path.abspath(path).encode()).hexdigest()


def _status(state: Path, path: str) -> str:
    for status in ("restored", "failed", "running"):
        if _key(state, path).with_suffix("." + status).exists():
            return status
    return "released"


def _failure_after(state: Path, path: str) -> int | None:
    rules = state / "fail"
    if not rules.exists():
        return None
    for line in rules.read_text().splitlines():
        name, _, limit = line.partition(" ")
        if os.path.basename(path) == name:
            return int(limit)
    return None


def copytool(args: argparse.Namespace, path: str) -> None:
    """Fill ``path`` from the archive in chunks, as Lustre's copytool fills a released file."""
    source = args.archive / Path(path).relative_to(args.mount)
    key = _key(args.state, path)
    chunk = int(os.environ.get("FAKE_LFS_CHUNK", 1 << 20))
    delay = float(os.environ.get("FAKE_LFS_DELAY", "0.01"))
    stop_at = _failure_after(args.state, path)
    done = 0
    with open(source, "rb") as src, open(path, "r+b") as dest:
        while data := src.read(chunk):
            if stop_at is not None and done + len(data) > stop_at:
                dest.write(data[: stop_at - done])
                dest.flush()
                key.with_suffix(".failed").touch()
                key.with_suffix(".running").unlink()
                return
            dest.write(data)
            done += len(data)
            key.with_suffix(".running").write_text(str(done))
            time.sleep(delay)
        dest.flush()
        os.fsync(dest.fileno())
    key.with_suffix(".restored").touch()
    key.with_suffix(".running").unlink()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--archive", type=Path, required=True)
    parser.add_argument("--mount", type=Path, required=True)
    parser.add_argument("command")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    with open(args.state / "calls.jsonl", "a") as log:
        log.write(json.dumps([args.command, *args.paths]) + "\n")
    for path in args.paths:
        if not os.path.exists(path):
            print(
                f"lfs {args.command}: cannot get HSM state of '{path}': No such file",
                file=sys.stderr,
            )
            return 2
    if args.command == "copytool":
        copytool(args, args.paths[0])
        return 0
    for path in args.paths:
        status = _status(args.state, path)
        if args.command == "hsm_restore":
            if status in ("released", "failed"):
                _key(args.state, path).with_suffix(".failed").unlink(missing_ok=True)
                _key(args.state, path).with_suffix(".running").write_text("0")
                subprocess.Popen(
                    [sys.executable, __file__, *argv[: argv.index(args.command)], "copytool", path],
                    start_new_session=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        elif args.command == "hsm_action":
            if status == "running":
                moved = _key(args.state, path).with_suffix(".running").read_text() or "0"
                print(f"{path}: RESTORE running ({moved} bytes moved)")
            else:
                print(f"{path}: NOOP")
        elif args.command == "hsm_state":
            if status == "restored":
                print(f"{path}: (0x00000009) exists archived, archive_id:1")
            else:
                print(f"{path}: (0x0000000d) released exists archived, archive_id:1")
        else:
            print(f"lfs: unknown command {args.command}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
