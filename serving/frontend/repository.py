"""What the front end knows about the models: read from the Triton model repository itself.

The chat template lives in the model's tokenizer, and the tokenizer path is in the vLLM engine
arguments (``<repo>/<name>/<version>/model.json``), so the front end reads the same files Triton
reads instead of being told twice. Only the newest version of each model is served, as Triton's
default version policy does.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.frontend.tool_parsers import parser_name
from serving.kserve.repository import RepositoryError as KServeRepositoryError
from serving.kserve.repository import read_config
from serving.package import TOOL_CALL_PARSER

logger = logging.getLogger(__name__)


class RepositoryError(RuntimeError):
    """The model repository cannot be read; the message names the file."""


@dataclass
class ModelEntry:
    name: str
    version: str
    kind: str  # "generate" | "embed"
    tokenizer_path: Path
    created: int
    # How the model writes tool calls under tool_choice auto (serving.frontend.tool_parsers);
    # None: the front end's default.
    tool_call_parser: str | None = None
    tokenizer: Any = field(default=None, repr=False)

    def chat_prompt_ready(self) -> None:
        """Load the tokenizer now (start-up) rather than on the first chat request."""
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.tokenizer_path)

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


def read_repository(root: Path) -> dict[str, ModelEntry]:
    """Every ``<root>/<name>/config.pbtxt`` with a numeric version directory holding model.json."""
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a directory")
    models: dict[str, ModelEntry] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (model_dir / "config.pbtxt").is_file():
            continue
        versions = sorted(
            (int(v.name) for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit()),
            reverse=True,
        )
        for version in versions:
            engine_args = model_dir / str(version) / "model.json"
            if engine_args.is_file():
                models[model_dir.name] = _entry(model_dir.name, str(version), engine_args)
                break
    return models


def _entry(name: str, version: str, path: Path) -> ModelEntry:
    try:
        args = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RepositoryError(f"{path}: {exc}") from None
    if not isinstance(args, dict) or not isinstance(args.get("model"), str):
        raise RepositoryError(f"{path}: engine arguments need a 'model' string")
    tokenizer = args.get("tokenizer") or args["model"]
    embed = args.get("runner") == "pooling" or args.get("convert") == "embed"
    return ModelEntry(
        tool_call_parser=_tool_call_parser(path.parent.parent),
        name=name,
        version=version,
        kind="embed" if embed else "generate",
        # As the engine resolves it: relative to the version directory, absolute as is.
        tokenizer_path=path.parent / tokenizer,
        created=int(path.stat().st_mtime or time.time()),
    )


def _tool_call_parser(model_dir: Path) -> str | None:
    """The model's ``tool_call_parser`` parameter in its ``config.pbtxt`` (Triton keeps
    parameters it does not know, so the file stays valid for ``tritonserver``)."""
    try:
        config = read_config(model_dir)
    except KServeRepositoryError as exc:
        raise RepositoryError(str(exc)) from None
    if TOOL_CALL_PARSER not in config.parameters:
        return None
    name = config.parameters[TOOL_CALL_PARSER].string_value
    try:
        return parser_name(name)
    except ValueError as exc:
        raise RepositoryError(f"{model_dir / 'config.pbtxt'}: {exc}") from None
