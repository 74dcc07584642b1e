"""The native engine's C++ core tested directly: native/tests/test_batch.cpp, built and run here.

The row state and the start_fill/fill protocol are tested through Python elsewhere; this
reaches what Python cannot arrange, such as a fill held up mid-flight or a part that fails on
the background thread. With CONSTRAINTS_SANITIZE=1 (as ``./dev sanitize`` sets) the program
is built with ASan and UBSan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
SANITIZE = os.environ.get("CONSTRAINTS_SANITIZE") == "1"


@pytest.mark.slow
def test_batch_core(tmp_path: Path) -> None:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    sources = [NATIVE / "tests" / "test_batch.cpp"]
    sources += sorted(p for p in (NATIVE / "src").glob("*.cpp") if p.name != "module.cpp")
    flags = ["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-pthread"]
    if SANITIZE:
        flags += [
            "-Werror",
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined",
        ]
    binary = tmp_path / "test_batch"
    # The sanitizer runtimes ./dev sanitize preloads into Python belong to neither the compiler
    # nor the program, which links its own.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def run_compiler(*args: str) -> None:
        build = subprocess.run([compiler, *flags, *args], capture_output=True, text=True, env=env)
        assert build.returncode == 0, f"the core test did not compile:\n{build.stderr}"

    # One compiler per source at once (the files take 5-10 s each), then one link.
    objects = [str(tmp_path / f"{source.stem}.o") for source in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        compiled = pool.map(
            lambda pair: run_compiler(f"-I{NATIVE / 'include'}", "-c", str(pair[0]), "-o", pair[1]),
            zip(sources, objects, strict=True),
        )
        list(compiled)  # re-raises the first failure
    run_compiler(*objects, "-o", str(binary))
    run = subprocess.run([str(binary)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, (
        f"the core test failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"
    )
