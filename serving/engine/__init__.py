"""The CPU engine: a Hugging Face model behind a batching loop (see :mod:`serving.engine.core`)."""

from serving.engine.core import Engine, load_engine
from serving.engine.model import ModelLoadError

__all__ = ["Engine", "ModelLoadError", "load_engine"]
