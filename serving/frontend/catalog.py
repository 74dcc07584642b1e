"""What the front end knows about the models it serves, from the Triton model repository itself.

The repository is read by :mod:`serving.repository`, the same reader the KServe server uses, so
the front end lists the models and versions the engine serves. On top of it this module keeps
only what the OpenAI API needs of a vLLM model: its kind (generative or embedding, from the
engine arguments), its tokenizer (whose chat template makes chat prompts; the path is in the
engine arguments, ``model.json``, so the front end reads the file Triton reads instead of being
told twice) and how it writes tool calls (the ``tool_call_parser`` parameter of its
``config.pbtxt``). Python-backend models are not served over the OpenAI API and are left out.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.frontend.errors import bad_request
from serving.frontend.tool_parsers import parser_name
from serving.package import CONFIG_FILE, ENGINE_ARGS_FILE, TOOL_CALL_PARSER
from serving.repository import BACKEND, ModelEntry, RepositoryError, read_repository
from serving.request_limits import max_prompt_chars

logger = logging.getLogger(__name__)


@dataclass
class OpenAIModel:
    """A vLLM model of the repository as the OpenAI API serves it."""

    name: str
    version: str
    kind: str  # "generate" | "embed"
    tokenizer_path: Path
    created: int
    # How the model writes tool calls under tool_choice auto (serving.frontend.tool_parsers);
    # None: the front end's default.
    tool_call_parser: str | None = None
    # The width of the model's logits (its config.json ``vocab_size``, what vLLM checks token ids
    # against); None when the weights' config cannot be read here.
    vocab_size: int | None = None
    # The most tokens the engine can take in a prompt (its ``max_model_len``, or what vLLM would
    # derive from the weights' config, at its most generous); None when neither says.
    max_model_len: int | None = None
    tokenizer: Any = field(default=None, repr=False)
    # Prompts longer than this many characters cannot fit max_model_len (set with the tokenizer).
    max_prompt_chars: int | None = None

    def chat_prompt_ready(self) -> None:
        """Load the tokenizer now (start-up) rather than on the first chat request."""
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_path)
            if self.max_model_len is not None:
                self.max_prompt_chars = max_prompt_chars(self.tokenizer, self.max_model_len)

    def check_prompt_length(self, prompt: str, param: str) -> None:
        """Refuse a prompt whose length alone shows it cannot fit the model's context, before
        the engine tokenizes it (a 50 MB prompt cost the engine gigabytes and minutes to learn
        that). Prompts that might fit go on to the engine's exact check."""
        if self.max_prompt_chars is not None and len(prompt) > self.max_prompt_chars:
            raise bad_request(
                f"the prompt is {len(prompt)} characters, more than {self.max_model_len} tokens "
                f"can spell; this model's context is {self.max_model_len} tokens",
                param,
                code="context_length_exceeded",
            )

    def chat_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The prompt text the model's own chat template makes of ``messages`` (and of
        ``tools``, OpenAI's tool objects, which templates that know tools describe)."""
        self.chat_prompt_ready()
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {self.name} has no chat template")
        prompt = self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        return str(prompt)


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def read_catalog(root: Path) -> dict[str, OpenAIModel]:
    """The vLLM models of the repository at ``root``, by name, at the version the engine
    serves; :class:`~serving.repository.RepositoryError` when the repository cannot be
    served."""
    return {
        entry.name: openai_model(entry)
        for entry in read_repository(root)
        if entry.backend == BACKEND
    }


def openai_model(entry: ModelEntry) -> OpenAIModel:
    args = entry.engine_args()
    tokenizer = args.get("tokenizer") or args["model"]
    embed = args.get("runner") == "pooling" or args.get("convert") == "embed"
    engine_args = entry.version_dir / ENGINE_ARGS_FILE
    return OpenAIModel(
        name=entry.name,
        version=entry.version,
        kind="embed" if embed else "generate",
        # As the engine resolves it: relative to the version directory, absolute as is.
        tokenizer_path=entry.version_dir / tokenizer,
        created=int(engine_args.stat().st_mtime or time.time()),
        tool_call_parser=_tool_call_parser(entry),
        vocab_size=_vocab_size(entry.version_dir / args["model"]),
        max_model_len=_max_model_len(args, entry.version_dir / args["model"]),
    )


# Where Hugging Face configs keep the context length (vLLM's _get_and_verify_max_len reads these).
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "model_max_length",
)


def _max_model_len(args: dict[str, Any], weights: Path) -> int | None:
    """The engine argument ``max_model_len`` when set; else the largest length the weights'
    config names, times a RoPE scaling factor: never less than the context vLLM derives, so the
    bound built on it refuses no prompt the engine would take."""
    value = args.get("max_model_len")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    try:
        config = json.loads((weights / "config.json").read_text())
    except (OSError, ValueError):
        return None
    lengths = []
    for source in (config, config.get("text_config") or {}):
        if not isinstance(source, dict):
            continue
        lengths += [source[k] for k in _LENGTH_KEYS if isinstance(source.get(k), int)]
        scaling = source.get("rope_scaling")
        if isinstance(scaling, dict) and isinstance(scaling.get("factor"), int | float):
            lengths = [int(n * max(1.0, float(scaling["factor"]))) for n in lengths]
    positive = [n for n in lengths if n > 0]
    return max(positive) if positive else None


def _vocab_size(weights: Path) -> int | None:
    """``vocab_size`` of the model's Hugging Face config (or of its ``text_config``, for models
    that wrap a language model), as vLLM reads it."""
    try:
        config = json.loads((weights / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for source in (config, config.get("text_config") or {}):
        size = source.get("vocab_size") if isinstance(source, dict) else None
        if isinstance(size, int) and size > 0:
            return size
    return None


def _tool_call_parser(entry: ModelEntry) -> str | None:
    """The model's ``tool_call_parser`` parameter (Triton keeps parameters it does not know, so
    the file stays valid for ``tritonserver``)."""
    if TOOL_CALL_PARSER not in entry.config.parameters:
        return None
    name = entry.config.parameters[TOOL_CALL_PARSER].string_value
    try:
        return parser_name(name)
    except ValueError as exc:
        raise RepositoryError(f"{entry.model_dir / CONFIG_FILE}: {exc}") from None
