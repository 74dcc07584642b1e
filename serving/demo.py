"""Serve the demo model the way the platform serves any version: as a package, through the
instance start-up sequence. ``./dev run`` starts it beside the portal.

    python -m serving.demo --workdir var/demo --port-base 9000

Makes the tiny demo model under ``<workdir>/weights`` (once), packages it as a vLLM-backend
model repository with a manifest, and replaces this process with ``python -m serving.instance``
listening on four consecutive ports: OpenAI API, KServe HTTP, KServe gRPC, engine metrics.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from serving.demo_model import make_demo_model
from serving.package import MANIFEST_FORMAT, archive_bytes, file_entries, vllm_repository_files

MODEL = "demo--tiny"


def build_demo_package(workdir: Path) -> Path:
    weights = workdir / "weights"
    if not (weights / "config.json").is_file():
        shutil.rmtree(weights, ignore_errors=True)
        make_demo_model(weights)
    return package_weights(weights, workdir / "demo-package.tar")


def package_weights(weights: Path, package: Path) -> Path:
    """A vLLM-backend package serving the model in ``weights`` as ``demo--tiny`` version 1."""
    files = vllm_repository_files(MODEL, 1, str(weights.resolve()), {"max_num_seqs": 16})
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": MODEL,
        "version": 1,
        "backend": "vllm",
        "api_surface": "openai+grpc",
        "triton_embedded": True,
        "constraint_plugins": ["platform-constraints"],
        "weights": str(weights.resolve()),
        "files": file_entries(files),
    }
    package.write_bytes(archive_bytes(files, manifest))
    return package


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the demo model as a platform instance.")
    parser.add_argument("--workdir", type=Path, default=Path("var/demo"))
    parser.add_argument(
        "--port-base", type=int, default=9000, help="OpenAI API port; the next three follow"
    )
    args, instance_args = parser.parse_known_args(argv)
    base = args.port_base
    ports = {"openai": base, "http": base + 1, "grpc": base + 2, "metrics": base + 3}
    for name, port in ports.items():
        instance_args += [f"--{name}-port", str(port)]
    args.workdir.mkdir(parents=True, exist_ok=True)
    package = build_demo_package(args.workdir)
    instance_dir = args.workdir / "instance"
    shutil.rmtree(instance_dir, ignore_errors=True)  # every start unpacks afresh
    command = [sys.executable, "-m", "serving.instance", "--package", str(package)]
    command += ["--workdir", str(instance_dir), *instance_args]
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
