"""Model-cache benchmark: local copy versus ``cp``, parallel S3 download versus one stream, and an
instance's cold start from the cache versus downloading its weights at start.

Run from the repository root::

    python bench/model_cache.py            # 512 MiB files, 3 runs each (a few minutes)
    python bench/model_cache.py --quick    # 64 MiB, 1 run: a smoke test
    python bench/model_cache.py --only local --runs 5   # the local copy only (about a minute)

What runs, all on this machine's disk and loopback:

- *local*: one file of random bytes, copied by ``cp`` and by the materializer's local source
  into a staging tree (sha256 on the way, fsync, link into the blob store). ``cp`` does not
  fsync, so ``cp`` + ``sync`` of the copy is reported too. Both read a source in page cache.
- *s3*: moto's S3 server as a separate process (so it does not share this one's GIL); one
  object read by a single ``get_object`` stream, and by the materializer's parallel ranged GETs
  (8 ranges of 16 MiB in flight). Both write to the same disk.
- *cold start*: a random-weights Llama (about ``--model-mib``) in safetensors, uploaded to S3.
  From the cache: the serving instance starts on weights already materialized (done at publish
  time, not counted). From the source: the weights are first downloaded (one stream per file,
  what an instance without the cache does), then the same instance starts. Timed to the
  instance's ``INSTANCE READY`` line.

Results go to ``bench/results/model_cache.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import ROOT, free_port, machine_info

MiB = 1024 * 1024


def _median_seconds(fn, runs: int, setup=None) -> float:
    """Median wall time of ``fn``; ``setup`` (removing the previous copy) is not timed."""
    times = []
    for _ in range(runs):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_local(work: Path, size: int, runs: int) -> dict[str, Any]:
    """Each run times every variant once, in turn (the disk's speed drifts: interleaving spreads
    the drift over all of them); medians and ranges over the runs."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(ARTIFACT_FILE_ROOTS=[work.resolve()])
    import hashlib

    from portal.cache import filecopy
    from portal.cache.materializer import copy_version
    from portal.cache.progress import Progress
    from portal.cache.sources import CopyOptions
    from portal.cache.sources.local import LocalSource
    from portal.cache.store import ContentStore

    source_dir = work / "artifact"
    source_dir.mkdir()
    (source_dir / "model.safetensors").write_bytes(os.urandom(size))
    src = source_dir / "model.safetensors"
    subprocess.run(["cat", str(src)], stdout=subprocess.DEVNULL, check=True)  # page cache
    time.sleep(filecopy.SETTLED_NS / 1e9)  # a just-written file takes the chunked path

    dst, cache = work / "cp.out", work / "cache"

    def clean() -> None:
        dst.unlink(missing_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        subprocess.run(["sync"], check=True)

    def cp() -> None:
        subprocess.run(["cp", str(src), str(dst)], check=True)

    def cp_sync() -> None:
        cp()
        subprocess.run(["sync", str(dst)], check=True)

    def sha256sum() -> None:
        subprocess.run(["sha256sum", str(src)], stdout=subprocess.DEVNULL, check=True)

    def hashlib_sha256() -> None:
        with src.open("rb") as file:
            hashlib.file_digest(file, "sha256")

    def materialize() -> None:
        store = ContentStore(cache)
        source = LocalSource(f"file://{source_dir}", source_dir)
        copy_version(source, store, store.staging("v"), Progress(), CopyOptions())

    def materialize_chunked() -> None:
        """The chunked path only (read+hash on one thread, write on another): the previous
        implementation, now taken with a throttle or for a just-written file."""
        settled, filecopy.SETTLED_NS = filecopy.SETTLED_NS, 10**18
        try:
            materialize()
        finally:
            filecopy.SETTLED_NS = settled

    variants = {
        "cp": cp,
        "cp_then_sync": cp_sync,
        "sha256sum": sha256sum,
        "hashlib_sha256": hashlib_sha256,
        "materialize_chunked": materialize_chunked,
        "materialize": materialize,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    loads = []
    for _ in range(runs):
        loads.append(os.getloadavg()[0])
        for name, fn in variants.items():
            clean()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    results = {name: statistics.median(t) for name, t in times.items()}
    return {
        "size_mib": size / MiB,
        "runs": runs,
        "load_before_runs": loads,
        "seconds": results,
        "mib_per_s": {k: size / MiB / v for k, v in results.items()},
        "mib_per_s_range": {
            k: [size / MiB / max(t), size / MiB / min(t)] for k, t in times.items()
        },
        "mib_per_s_runs": {k: [round(size / MiB / x) for x in t] for k, t in times.items()},
        "materialize_vs_cp": results["cp"] / results["materialize"],
        "materialize_vs_cp_then_sync": results["cp_then_sync"] / results["materialize"],
        "materialize_vs_sha256sum": results["sha256sum"] / results["materialize"],
        "materialize_vs_hashlib_sha256": results["hashlib_sha256"] / results["materialize"],
        "materialize_vs_chunked": results["materialize_chunked"] / results["materialize"],
    }


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> MotoServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url, timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("moto server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait()


def s3_client(url: str):
    """The materializer's own client, pointed at the moto server the way production points it
    at any S3-compatible store: through the environment."""
    from portal.cache.sources.s3 import s3_client as make

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_ENDPOINT_URL_S3"] = url
    return make(8)


def single_stream(client, bucket: str, key: str, dest: Path) -> None:
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    with dest.open("wb") as out:
        while chunk := body.read(MiB):
            out.write(chunk)


def bench_s3(work: Path, url: str, size: int, runs: int) -> dict[str, Any]:
    from portal.cache.progress import Progress
    from portal.cache.sources import CopyOptions, SourceFile
    from portal.cache.sources.s3 import S3Source
    from portal.cache.store import ContentStore

    client = s3_client(url)
    client.create_bucket(Bucket="bench")
    src = work / "s3-object"
    src.write_bytes(os.urandom(size))
    client.upload_file(str(src), "bench", "m/model.safetensors")
    src.unlink()
    head = client.head_object(Bucket="bench", Key="m/model.safetensors")

    def one_stream() -> None:
        single_stream(client, "bench", "m/model.safetensors", work / "single.out")

    def parallel() -> None:
        store = ContentStore(work / "s3-cache")
        staging = store.staging("v")
        staging.discard()
        source = S3Source("s3://bench/m", bucket="bench", prefix="m", client=client)
        file = SourceFile(
            path="model.safetensors", size=size, locator="m/model.safetensors",
            extra={"etag": head["ETag"].strip('"')},
        )  # fmt: skip
        source.fetch(file, staging, Progress(), CopyOptions(parallelism=8, part_size=16 * MiB))

    results = {"single_stream": _median_seconds(one_stream, runs)}
    results["parallel_ranged"] = _median_seconds(parallel, runs)
    return {
        "size_mib": size / MiB,
        "seconds": results,
        "mib_per_s": {k: size / MiB / v for k, v in results.items()},
        "parallel_vs_single": results["single_stream"] / results["parallel_ranged"],
    }


def start_instance(weights: Path, work: Path) -> float:
    """Seconds from launching ``serving.instance`` to its ``INSTANCE READY`` line."""
    from serving.demo import package_weights

    package = package_weights(weights, work / "package.tar")
    instance_dir = work / "instance"
    shutil.rmtree(instance_dir, ignore_errors=True)
    ports = [str(free_port()) for _ in range(4)]
    command = [sys.executable, "-m", "serving.instance", "--package", str(package)]
    command += ["--workdir", str(instance_dir)]
    for flag, port in zip(("openai", "http", "grpc", "metrics"), ports, strict=True):
        command += [f"--{flag}-port", port]
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("INSTANCE READY"):
                return time.perf_counter() - start
        raise RuntimeError(f"instance exited with {proc.wait()} before it was ready")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def bench_cold_start(work: Path, url: str, model_mib: int, runs: int) -> dict[str, Any]:
    from serving.demo_model import make_demo_model

    hidden = 512
    layers = max(1, round(model_mib * MiB / 4 / (12 * hidden * hidden)))
    model = make_demo_model(work / "model", hidden_size=hidden, layers=layers)
    files = sorted(p for p in model.iterdir() if p.is_file())
    size = sum(p.stat().st_size for p in files)
    client = s3_client(url)
    client.create_bucket(Bucket="coldstart")
    for path in files:
        client.upload_file(str(path), "coldstart", f"m/{path.name}")

    def download_then_start() -> float:
        dest = work / "downloaded"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        start = time.perf_counter()
        for path in files:
            single_stream(client, "coldstart", f"m/{path.name}", dest / path.name)
        return (time.perf_counter() - start) + start_instance(dest, work)

    # Publish time: materialize from S3 into the cache (not part of any start).
    from portal.cache.materializer import copy_version
    from portal.cache.progress import Progress
    from portal.cache.sources import CopyOptions
    from portal.cache.sources.s3 import S3Source
    from portal.cache.store import ContentStore

    store = ContentStore(work / "cold-cache")
    staging = store.staging("m")
    source = S3Source("s3://coldstart/m", bucket="coldstart", prefix="m", client=client)
    store.publish(
        staging, "models/m", copy_version(source, store, staging, Progress(), CopyOptions())
    )
    cached = store.tree("models/m")

    from_cache = statistics.median(start_instance(cached, work) for _ in range(runs))
    from_source = statistics.median(download_then_start() for _ in range(runs))
    return {
        "model_mib": size / MiB,
        "hidden_size": hidden,
        "layers": layers,
        "seconds": {"from_cache": from_cache, "download_at_start": from_source},
        "download_at_start_vs_cache": from_source / from_cache,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--model-mib", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--only", choices=["local"], help="run one part (writes model_cache_<part>.md)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.model_mib, args.runs = 64, 32, 1
    size = args.size_mib * MiB
    results: dict[str, Any] = {
        "command": "python bench/model_cache.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(("boto3", "moto", "torch", "transformers")),
    }
    with tempfile.TemporaryDirectory(dir=ROOT / "var" if (ROOT / "var").is_dir() else None) as tmp:
        work = Path(tmp)
        results["local"] = bench_local(work, size, args.runs)
        print(json.dumps(results["local"], indent=2), flush=True)
        if args.only == "local":
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "model_cache_local.md").write_text(render_local(results))
            return
        with MotoServer() as moto:
            results["s3"] = bench_s3(work, moto.url, size, args.runs)
            print(json.dumps(results["s3"], indent=2), flush=True)
            results["cold_start"] = bench_cold_start(work, moto.url, args.model_mib, args.runs)
            print(json.dumps(results["cold_start"], indent=2), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model_cache.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "model_cache.md").write_text(render(results))


def render(r: dict[str, Any]) -> str:
    local, s3, cold = r["local"], r["s3"], r["cold_start"]
    mbps = local["mib_per_s"]
    return (
        f"# Model cache\n\n`{r['command']}` on {r['machine'].get('cpu_model', '?')}, "
        f"{r['machine']['cpu_count']} CPUs\n\n"
        f"| measure | result |\n|---|---|\n"
        f"| local copy, {local['size_mib']:.0f} MiB: cp / cp+sync / materialize | "
        f"{mbps['cp']:.0f} / {mbps['cp_then_sync']:.0f} / {mbps['materialize']:.0f} MiB/s |\n"
        f"| materialize vs cp (vs cp+sync; vs sha256sum) | {local['materialize_vs_cp']:.0%} "
        f"({local['materialize_vs_cp_then_sync']:.0%}; {local['materialize_vs_sha256sum']:.0%}) |\n"
        f"| S3 {s3['size_mib']:.0f} MiB: single stream / parallel ranged | "
        f"{s3['mib_per_s']['single_stream']:.0f} / {s3['mib_per_s']['parallel_ranged']:.0f} "
        f"MiB/s ({s3['parallel_vs_single']:.2f}x) |\n"
        f"| cold start, {cold['model_mib']:.0f} MiB model: from cache / download at start | "
        f"{cold['seconds']['from_cache']:.1f} s / {cold['seconds']['download_at_start']:.1f} s "
        f"({cold['download_at_start_vs_cache']:.2f}x) |\n"
    )


def render_local(r: dict[str, Any]) -> str:
    local = r["local"]
    rows = {
        "cp": "`cp` (page cache only, no fsync)",
        "cp_then_sync": "`cp` + `sync`",
        "sha256sum": "`sha256sum` alone (coreutils)",
        "hashlib_sha256": "`hashlib.file_digest` sha256 alone (OpenSSL, in process)",
        "materialize_chunked": "materialize, chunked path (the previous implementation)",
        "materialize": "materialize (kernel copy + hash on a second thread)",
    }
    lines = [
        f"# Model cache: local copy\n\n`{r['command']}` on {r['machine'].get('cpu_model', '?')}, "
        f"{r['machine']['cpu_count']} CPUs; {local['size_mib']:.0f} MiB, source in page cache, "
        f"{local['runs']} runs interleaved (1-min load before each run: "
        f"{', '.join(f'{x:.2f}' for x in local['load_before_runs'])})\n",
        "| variant | median MiB/s | range MiB/s | runs |",
        "|---|---|---|---|",
    ]
    for key, label in rows.items():
        low, high = local["mib_per_s_range"][key]
        lines.append(
            f"| {label} | {local['mib_per_s'][key]:.0f} | {low:.0f}-{high:.0f} | "
            f"{', '.join(map(str, local['mib_per_s_runs'][key]))} |"
        )
    lines.append(
        f"\nmaterialize as a share of `cp`: {local['materialize_vs_cp']:.0%}; of `cp` + `sync`: "
        f"{local['materialize_vs_cp_then_sync']:.0%}; of `sha256sum`: "
        f"{local['materialize_vs_sha256sum']:.0%}; of hashlib sha256: "
        f"{local['materialize_vs_hashlib_sha256']:.0%}; against the chunked path: "
        f"{local['materialize_vs_chunked']:.2f}x\n"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
