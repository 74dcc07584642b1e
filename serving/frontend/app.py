"""The FastAPI application: OpenAI routes over the engine's KServe v2 endpoints.

:func:`create_app` is what both ``python -m serving.frontend`` and the instance supervisor
(``serving.instance``) run under uvicorn. The gRPC channel is opened in the app's lifespan,
inside the serving event loop, as grpc.aio requires.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from serving.frontend.catalog import OpenAIModel, read_catalog
from serving.frontend.errors import (
    OpenAIError,
    bad_request,
    internal_error_handler,
    limit_error_body,
    model_not_found,
    openai_error_handler,
    validation_error_handler,
)
from serving.frontend.generation import Generation, complete, completion_prompts, open_stream
from serving.frontend.kserve_client import KServeClient
from serving.frontend.metrics import add_metrics
from serving.frontend.observations import (
    MAX_READ,
    ObservationLog,
    record_generation,
    record_refusal,
)
from serving.frontend.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from serving.frontend.settings import Settings
from serving.frontend.tools import template_tool_calls, template_tools
from serving.frontend.translate import check_embedding, check_supported, check_token_ids
from serving.request_limits import BoundedBody

logger = logging.getLogger(__name__)


def prepare_models(repository: Path, openai: bool) -> dict[str, OpenAIModel]:
    """The repository's models with what a first request would otherwise wait for loaded
    (:func:`load_for_requests`). The instance supervisor runs this on a thread while the engine
    starts (:mod:`serving.instance.supervisor`): seconds that do not depend on the engine."""
    models = read_catalog(repository)
    load_for_requests(models, openai)
    return models


def load_for_requests(models: dict[str, OpenAIModel], openai: bool) -> None:
    """Load the generative models' tokenizers (chat templates, prompt limits) and XGrammar,
    which turns JSON schemas into grammars (:mod:`serving.constraints.json_schema`); its import
    takes seconds, which must not stall the first request that sends a schema."""
    generative = [entry for entry in models.values() if entry.kind == "generate"]
    if not openai or not generative:
        return
    for entry in generative:
        entry.chat_prompt_ready()
    importlib.import_module("xgrammar")


def create_app(settings: Settings, models: dict[str, OpenAIModel] | None = None) -> FastAPI:
    """The app over ``models`` as :func:`prepare_models` makes them; without them the app reads
    the repository now and loads the rest in its lifespan, off the event loop."""
    client = KServeClient(
        settings.kserve_grpc, settings.kserve_http, timeout=settings.engine_timeout
    )
    catalog = read_catalog(settings.model_repository) if models is None else models
    observations = ObservationLog.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await client.start()
        await asyncio.to_thread(load_for_requests, catalog, settings.openai)  # no-op if loaded
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="LLM serving instance (OpenAI-compatible)", lifespan=lifespan)
    app.add_exception_handler(OpenAIError, openai_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(Exception, internal_error_handler)
    # FastAPI parses the JSON before a handler runs: size, encoding and depth are checked first.
    app.add_middleware(
        BoundedBody,
        limit=settings.max_body_bytes,
        error_body=limit_error_body,
        check_json=True,
    )
    add_metrics(app, settings.kserve_metrics, settings.multiproc_dir)

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> Response:
        if await client.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    if not settings.openai:
        return app

    def lookup(name: str, kind: str) -> OpenAIModel:
        entry = catalog.get(name)
        if entry is None:
            raise model_not_found(name)
        if entry.kind != kind:
            what = "an embedding" if entry.kind == "embed" else "a generative"
            raise bad_request(f"model {name} is {what} model", "model", code="wrong_model_kind")
        return entry

    def card(entry: OpenAIModel) -> dict[str, Any]:
        return {
            "id": entry.name,
            "object": "model",
            "created": entry.created,
            "owned_by": "platform",
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [card(m) for m in catalog.values()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict[str, Any]:
        if model not in catalog:
            raise model_not_found(model)
        return card(catalog[model])

    async def run(generation: Generation) -> Response:
        observe = observations.wanted()
        route = "chat" if isinstance(generation.request, ChatCompletionRequest) else "completions"
        try:
            if generation.request.stream:
                if observe:
                    generation.on_stream_end = lambda g, status, error: record_generation(
                        observations, g, streamed=True, status=status, error=error
                    )
                return StreamingResponse(
                    await open_stream(client, generation), media_type="text/event-stream"
                )
            body = await complete(client, generation)
        except OpenAIError as exc:
            if observe:
                record_refusal(
                    observations, generation.model, route, generation.started, exc.status, exc.type
                )
            raise
        # The checks of a structured answer run once it has been sent, on the event loop as a
        # stream's do: a plain function as a background task would be handed to a worker
        # thread, a thread hop per request that cost more CPU than the observation itself.
        background = BackgroundTask(observe_whole, generation) if observe else None
        return JSONResponse(body, background=background)

    async def observe_whole(generation: Generation) -> None:
        record_generation(observations, generation, streamed=False)

    @app.get("/observations")
    async def read_observations(after: int = 0, limit: int = MAX_READ) -> dict[str, Any]:
        """The requests this process served, for the rollout's canary analysis
        (:mod:`serving.frontend.observations`)."""
        return observations.read(after, limit)

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest) -> Response:
        started = time.monotonic()  # the chat template's time counts in the observation
        entry = lookup(request.model, "generate")
        check_supported(request)
        check_token_ids(request, entry.vocab_size)
        messages = [_message(m.model_dump(exclude_none=True)) for m in request.messages]
        tools = template_tools(request)
        try:
            prompt = await asyncio.to_thread(entry.chat_prompt, messages, tools)
        except Exception as exc:  # the template's own error (e.g. role order) is the caller's
            raise bad_request(f"the chat template refused messages: {exc}", "messages") from None
        entry.check_prompt_length(prompt, "messages")
        generation = Generation(
            request,
            entry.name,
            [prompt],
            settings.default_max_tokens,
            tool_call_parser=entry.tool_call_parser or settings.tool_call_parser,
            started=started,
        )
        return await run(generation)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> Response:
        started = time.monotonic()
        entry = lookup(request.model, "generate")
        check_supported(request)
        check_token_ids(request, entry.vocab_size)
        prompts = completion_prompts(request)
        if isinstance(request.prompt, str) or (
            request.prompt and isinstance(request.prompt[0], str)
        ):
            for prompt in prompts:
                entry.check_prompt_length(prompt, "prompt")
        generation = Generation(
            request, entry.name, prompts, settings.default_max_tokens, started=started
        )
        return await run(generation)

    @app.post("/v1/embeddings")
    async def embeddings(request: EmbeddingRequest) -> dict[str, Any]:
        entry = lookup(request.model, "embed")
        texts = check_embedding(request)
        results = await client.embed(entry.name, texts)
        data = []
        for i, (vector, _) in enumerate(results):
            value: Any = vector
            if request.encoding_format == "base64":
                value = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(count for _, count in results)
        return {
            "object": "list",
            "data": data,
            "model": entry.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return app


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as HF chat templates take it: text parts joined, ``developer`` (OpenAI's
    newer name for the system role) as ``system``, which templates know."""
    content = message.get("content")
    if isinstance(content, list):
        message["content"] = "".join(part["text"] for part in content)
    elif content is None:
        message["content"] = ""
    if message["role"] == "developer":
        message["role"] = "system"
    if "tool_calls" in message:
        message["tool_calls"] = template_tool_calls(message["tool_calls"])
    return message
