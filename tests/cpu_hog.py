"""Keep every core busy, for ``./dev test --under-load``: one busy-looping process per core (or
``--processes N``) at normal priority, until this process is stopped or its parent dies.

The suite must hold on a machine whose cores are taken by something else; this is that something
else. It reaches no network and writes nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _spin() -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    value = 0
    while True:
        value = (value * 1103515245 + 12345) & 0xFFFFFFFF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.processes)]
    for spinner in spinners:
        spinner.start()
    print(f"cpu_hog: {args.processes} busy process(es)", file=sys.stderr, flush=True)

    def stop(signum, frame):
        for spinner in spinners:
            spinner.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for spinner in spinners:
        spinner.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
