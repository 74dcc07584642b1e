"""The example plugin wheels, built once per test process and shared by the modules that use
them (``pip wheel`` takes seconds; the wheels never change within a run)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from tests.plugin_wheels import build_example_wheels


@functools.cache
def example_wheels() -> dict[str, Path]:
    """``{"no_repeat_window": path, "tiny_bigram": path}``: read them, do not change them."""
    root = Path(tempfile.mkdtemp(prefix="plugin-wheels-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return build_example_wheels(root)
