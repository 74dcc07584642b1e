"""What every benchmark records about where it ran, and a free loopback port.

Every result names its machine through these functions only, so that figures from different
benchmarks (and from different runs of one) describe a machine the same way and can be compared.
Only the standard library is imported: ``bench/gpu_check.py`` runs on bare device machines.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def machine_info(packages: tuple[str, ...]) -> dict[str, Any]:
    """The host (``host_info``), the versions of ``packages`` and the commit."""
    return {**host_info(), **package_versions(packages), "commit": git_commit()}


def host_info() -> dict[str, Any]:
    """Python, OS, CPU (model, family, whether virtualized), last-level cache and memory: what
    decides whether two results can be compared."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        for key, field_name in (
            ("model name", "cpu_model"),
            ("cpu family", "cpu_family"),
            ("model", "cpu_model_number"),
        ):
            m = re.search(rf"^{key}\s*:\s*(.+)$", cpuinfo, re.M)
            if m:
                info[field_name] = m.group(1).strip()
        info["hypervisor"] = " hypervisor " in cpuinfo.split("flags", 1)[-1].split("\n", 1)[0] + " "
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        if m:
            info["memory_gib"] = round(int(m.group(1)) / 2**20, 1)
    except OSError:
        pass
    info["llc_bytes"] = llc_bytes()
    return info


def llc_bytes() -> int:
    """The largest cache cpu0 reports (32 MiB when none does): benchmarks size their buffers
    past it so that timed reads come from memory, as they would under load."""
    best = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (path / "size").read_text().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if m:
            best = max(
                best, int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
            )
    return best or 32 * 2**20


def package_versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    """Each package's installed version, None where it is not installed."""
    versions: dict[str, str | None] = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


def git_dirty() -> bool | None:
    """Whether tracked files differ from the commit (a result may not be the commit's)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def gpu_info(torch: Any, device: Any) -> dict[str, Any]:
    """The CUDA device's name, SM count, memory, CUDA version and compute capability.

    ``torch`` is passed in so that this module imports nothing beyond the standard library."""
    props = torch.cuda.get_device_properties(device)
    return {
        "device_name": props.name,
        "sms": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "capability": f"{props.major}.{props.minor}",
    }
