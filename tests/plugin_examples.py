"""The example plugin wheels, built once per test process and shared by the modules that use
them (``pip wheel`` takes seconds; the wheels never change within a run)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.plugin_wheels import build_example_wheels


@functools.cache
def example_wheels() -> dict[str, Path]:
    """``{"no_repeat_window": path, "tiny_bigram": path}``: read them, do not change them."""
    root = Path(tempfile.mkdtemp(prefix="plugin-wheels-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return build_example_wheels(root)


@functools.cache
def installed_examples() -> Path:
    """The example wheels installed as an instance installs them (``pip --target``)."""
    wheels = example_wheels()
    site = next(iter(wheels.values())).parent / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(site), *map(str, wheels.values())],
        check=True,
    )  # fmt: skip
    return site


_MAKE_BIGRAM = """
import sys, torch
from transformers import AutoTokenizer
from tiny_bigram import register
from tiny_bigram.modeling import TinyBigramConfig, TinyBigramForCausalLM

register()
out, tokenizer_dir = sys.argv[1:3]
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
torch.manual_seed(0)
model = TinyBigramForCausalLM(TinyBigramConfig(vocab_size=len(tokenizer), hidden_size=16))
special = set(tokenizer.all_special_ids)
with torch.no_grad():
    unit = torch.nn.functional.normalize(torch.randn_like(model.embed.weight), dim=-1)
    model.embed.weight.copy_(unit)
    head = unit.clone()
    for token in range(len(tokenizer)):
        piece = tokenizer.decode([token])
        if token in special or not piece or "\\ufffd" in piece:
            head[token] = 0  # never a likely successor: outputs read back as distinct text
    model.head.weight.copy_(head)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def make_bigram_checkpoint(out: Path, tokenizer_dir: Path) -> Path:
    """A TinyBigramForCausalLM checkpoint (the example's custom architecture) with the
    tokenizer at ``tokenizer_dir``. Embeddings are unit vectors and the head is the embedding
    matrix, so each token's most likely successor is itself: greedy output repeats one token
    unless a processor forbids it. Special tokens and pieces that are not whole characters are
    never likely successors, so every generated token reads back as its own text. Made in a
    child process with the installed example on its path (the test process stays as it was)."""
    env = {**os.environ, "PYTHONPATH": str(installed_examples())}
    subprocess.run(
        [sys.executable, "-c", _MAKE_BIGRAM, str(out), str(tokenizer_dir)], check=True, env=env
    )
    return out
