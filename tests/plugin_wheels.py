"""Plugin wheels for the tests: the worked examples in ``examples/plugins`` built with pip (as an
author would, offline), and small hand-made wheels for the cases an author gets wrong."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "plugins"
#: The example projects, by the distribution name their wheel carries.
EXAMPLE_PROJECTS = {"no_repeat_window": "no-repeat-window", "tiny_bigram": "tiny-bigram"}


def build_example_wheels(dest: Path) -> dict[str, Path]:
    """``pip wheel`` each example (from a copy: the build writes next to the sources)."""
    dest.mkdir(parents=True, exist_ok=True)
    built: dict[str, Path] = {}
    for dist, project in EXAMPLE_PROJECTS.items():
        source = dest / "src" / project
        shutil.copytree(EXAMPLES / project, source)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--quiet", "--wheel-dir", str(dest), str(source)],
            check=True,
        )  # fmt: skip
        (built[dist],) = dest.glob(f"{dist}-*.whl")
    return built


def make_wheel(
    dest: Path,
    name: str,
    version: str = "1.0.0",
    *,
    entry_points: dict[str, dict[str, str]] | None = None,
    requires: list[str] | None = None,
    files: dict[str, str] | None = None,
    tag: str = "py3-none-any",
    description: str = "",
    compression: int = zipfile.ZIP_STORED,
) -> Path:
    """A wheel as pip would install it: ``files`` (path: source) plus the dist-info
    (``METADATA``, with ``description`` as its body, ``WHEEL``, ``entry_points.txt``,
    ``RECORD``)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    members: dict[str, str] = dict(files or {})
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires or []]
    members[f"{info}/METADATA"] = "\n".join(metadata) + "\n" + (description and f"\n{description}")
    members[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    )
    if entry_points:
        members[f"{info}/entry_points.txt"] = "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in names.items()) + "\n"
            for group, names in entry_points.items()
        )
    record = []
    for path, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    members[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", compression=compression) as archive:
        for path, text in members.items():
            archive.writestr(path, text)
    return wheel
