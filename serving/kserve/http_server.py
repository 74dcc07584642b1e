"""KServe v2 over HTTP at Triton's routes (``src/http_server.cc``), plus Triton's generate
extension.

Answers as Triton does: health is 200 or 400 with an empty body; errors are
``{"error": "<message>"}`` with the status ``HttpCodeFromError`` picks. ``/infer`` serves
non-decoupled (Python-backend) models, with the binary tensor extension
(:mod:`serving.kserve.http_infer`), and refuses decoupled ones, every vLLM-backend model among
them ("HTTP end point doesn't support models with decoupled transaction policy", 501),
exactly like Triton; generation over HTTP goes through
``/generate`` (exactly one response: a non-streaming request) and ``/generate_stream``
(server-sent events, one ``data: {json}`` per response; pass ``"stream": true`` for
incremental output, as with Triton).

Generate bodies map like Triton's: a top-level key (or a key of ``"parameters"``) naming a
model input becomes that input tensor; any other key becomes a request parameter, which must be
a string, number or bool. Without a ``sampling_parameters`` input, the vLLM backend reads its
sampling parameters from those request parameters. Responses carry ``model_name``,
``model_version``, ``id`` (when given) and each output, a one-element output as a scalar.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import numpy as np
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from serving import request_limits
from serving.kserve.contract import Tensor
from serving.kserve.errors import Code, TritonError, invalid
from serving.kserve.grpc_codec import NUMPY_TYPES
from serving.kserve.grpc_server import (
    EXTENSIONS,
    SERVER_NAME,
    SERVER_VERSION,
    refuse_load_overrides,
)
from serving.kserve.http_infer import (
    HEADER_LENGTH,
    decompress,
    infer_response,
    load_json,
    parse_infer,
)
from serving.kserve.service import InferenceService, ServedModel
from serving.kserve.triton_metrics import Duration, ModelStats
from serving.request_limits import BoundedBody

HTTP_DECOUPLED_MESSAGE = "HTTP end point doesn't support models with decoupled transaction policy"
_GENERATE_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


def _error(exc: TritonError) -> JSONResponse:
    return JSONResponse({"error": exc.message}, status_code=exc.http_status)


def _stats_json(stats: ModelStats) -> dict[str, Any]:
    def duration(d: Duration) -> dict[str, int]:
        return {"count": d.count, "ns": d.ns}

    return {
        "name": stats.name,
        "version": stats.version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": duration(stats.success),
            "fail": duration(stats.fail),
            "queue": duration(stats.queue),
            "compute_input": duration(stats.compute_input),
            "compute_infer": duration(stats.compute_infer),
            "compute_output": duration(stats.compute_output),
            "cache_hit": {"count": 0, "ns": 0},
            "cache_miss": {"count": 0, "ns": 0},
        },
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }


def _json_tensor(model: ServedModel, name: str, value: Any) -> Tensor:
    spec = model.inputs[name]
    values = value if isinstance(value, list) else [value]
    if spec.datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise invalid(f"input '{name}' expects a string (or a list of strings)")
        try:
            encoded = [v.encode("utf-8") for v in values]
        except UnicodeEncodeError:  # a lone surrogate, which JSON's \u escapes can spell
            raise invalid(f"input '{name}' is not valid UTF-8 text") from None
        data = np.array(encoded, dtype=np.object_)
    elif spec.datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise invalid(f"input '{name}' expects a JSON boolean")
        data = np.array(values, dtype=np.bool_)
    else:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise invalid(f"input '{name}' expects a number")
        data = np.array(values, dtype=NUMPY_TYPES[spec.datatype])  # the model's own type
    shape = tuple(len(values) if d == -1 else d for d in spec.dims)
    if int(np.prod(shape)) != len(values):
        raise invalid(
            f"unexpected shape for input '{name}' for model '{model.name}'. "
            f"Expected {list(spec.dims)}, got [{len(values)}]. "
        )
    return Tensor(name, spec.datatype, shape, data.reshape(shape))


def _generate_request(
    model: ServedModel, body: Any
) -> tuple[dict[str, Tensor], dict[str, Any], str]:
    """Triton's generate mapping: inputs by name, everything else a request parameter."""
    if not isinstance(body, dict):
        raise invalid("generate request body must be a JSON object")
    tensors: dict[str, Tensor] = {}
    parameters: dict[str, Any] = {}
    request_id = ""

    def take(key: str, value: Any) -> None:
        if key in model.inputs:
            tensors[key] = _json_tensor(model, key, value)
        elif isinstance(value, str | int | float | bool):
            parameters[key] = value
        else:
            raise invalid(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )

    for key, value in body.items():
        if key == "parameters":
            if not isinstance(value, dict):
                raise invalid("Expected JSON object for keyword: 'parameters'")
            for nested_key, nested in value.items():
                if nested_key in body and nested_key != "parameters" and nested_key in model.inputs:
                    raise invalid(
                        f"Keyword '{nested_key}' for nested schema also given as input tensor name"
                    )
                take(nested_key, nested)
        elif key == "id":
            request_id = str(value)
        else:
            take(key, value)
    return tensors, parameters, request_id


def _response_json(model: ServedModel, request_id: str, outputs: list[Tensor]) -> dict[str, Any]:
    body: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if request_id:
        body["id"] = request_id
    for tensor in outputs:
        values = [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v.item()
            for v in tensor.data.reshape(-1)
        ]
        body[tensor.name] = values[0] if len(values) == 1 else values
    return body


def _limit_error(status: int, message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _internal_error(request: Request, exc: Exception) -> Response:
    """A bug answers in Triton's shape and says nothing of the code: the traceback goes to the
    log (uvicorn logs the exception as it leaves the app), never to the caller."""
    return JSONResponse({"error": "internal server error"}, status_code=500)


def build_app(service: InferenceService, max_body_bytes: int | None = None) -> Starlette:
    """The KServe v2 HTTP app; bodies over ``max_body_bytes`` (default
    ``$SERVING_MAX_BODY_BYTES``) are refused with 413, compressed ones once inflated past it."""
    body_limit = request_limits.max_body_bytes() if max_body_bytes is None else max_body_bytes

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(
            {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}
        )

    async def live(request: Request) -> Response:
        return Response(status_code=200 if service.live() else 400)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if service.ready() else 400)

    def model_of(request: Request) -> ServedModel:
        return service.get(request.path_params["model"], request.path_params.get("version", ""))

    async def model_metadata(request: Request) -> Response:
        try:
            meta = service.metadata(
                request.path_params["model"], request.path_params.get("version", "")
            )
        except TritonError as exc:
            return _error(exc)
        return JSONResponse(meta)

    async def model_ready(request: Request) -> Response:
        name, version = request.path_params["model"], request.path_params.get("version", "")
        if not await service.model_ready(name, version):
            return JSONResponse({"error": "Model version not ready"}, status_code=400)
        return Response(status_code=200)

    async def model_config(request: Request) -> Response:
        try:
            model = model_of(request)
        except TritonError as exc:
            return _error(exc)
        return JSONResponse(
            json_format.MessageToDict(model.config, preserving_proto_field_name=True)
        )

    async def model_stats(request: Request) -> Response:
        name = request.path_params.get("model", "")
        if name:
            try:
                model_of(request)
            except TritonError as exc:
                return _error(exc)
        stats = [s for s in service.stats.snapshot() if not name or s.name == name]
        return JSONResponse({"model_stats": [_stats_json(s) for s in stats]})

    async def infer(request: Request) -> Response:
        started = time.monotonic_ns()
        try:
            model = model_of(request)
            if model.decoupled:
                raise TritonError(Code.UNSUPPORTED, HTTP_DECOUPLED_MESSAGE)
            body = decompress(
                await request.body(), request.headers.get("content-encoding"), body_limit
            )
            call = parse_infer(body, request.headers.get(HEADER_LENGTH))
            last = await service.infer_unary(
                model,
                call.tensors,
                call.parameters,
                call.request_id,
                call.requested,
                input_ns=time.monotonic_ns() - started,
            )
        except TritonError as exc:
            return _error(exc)
        content, header_length = infer_response(call, model.name, model.version, last.outputs)
        if header_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(header_length)},
        )

    async def parse(request: Request) -> tuple[ServedModel, dict[str, Tensor], dict[str, Any], str]:
        model = model_of(request)
        raw = await request.body()
        body = load_json(raw) if raw else None
        tensors, parameters, request_id = _generate_request(model, body)
        return model, tensors, parameters, request_id

    async def generate(request: Request) -> Response:
        started = time.monotonic_ns()
        try:
            model, tensors, parameters, request_id = await parse(request)
            stream = tensors.get("stream")
            if stream is not None and bool(stream.data.reshape(-1)[0]):
                raise TritonError(Code.INTERNAL, _GENERATE_ONE)
            responses = service.infer(
                model, tensors, parameters, request_id, input_ns=time.monotonic_ns() - started
            )
            async with aclosing(responses) as iterator:
                results = [r async for r in iterator]
        except TritonError as exc:
            return _error(exc)
        if len(results) != 1:
            return _error(TritonError(Code.INTERNAL, _GENERATE_ONE))
        return JSONResponse(_response_json(model, request_id, results[0].outputs))

    async def generate_stream(request: Request) -> Response:
        started = time.monotonic_ns()
        try:
            model, tensors, parameters, request_id = await parse(request)
        except TritonError as exc:
            return _error(exc)
        responses = service.infer(
            model, tensors, parameters, request_id, input_ns=time.monotonic_ns() - started
        )
        # Pull the first response before answering, so its error (if any) sets the status.
        iterator = aiter(responses)
        try:
            first = await anext(iterator)
        except TritonError as exc:
            body = f"data: {json.dumps({'error': exc.message})}\n\n"
            return Response(body, status_code=exc.http_status, media_type="text/event-stream")
        except StopAsyncIteration:
            first = None

        async def events() -> AsyncIterator[str]:
            async with aclosing(responses):
                if first is not None:
                    payload = _response_json(model, request_id, first.outputs)
                    yield f"data: {json.dumps(payload)}\n\n"
                try:
                    async for response in iterator:
                        payload = _response_json(model, request_id, response.outputs)
                        yield f"data: {json.dumps(payload)}\n\n"
                except TritonError as exc:
                    yield f"data: {json.dumps({'error': exc.message})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream; charset=utf-8")

    async def json_body(request: Request) -> Any:
        raw = await request.body()
        return load_json(raw) if raw else {}

    async def repository_index(request: Request) -> Response:
        try:
            body = await json_body(request)
        except TritonError as exc:
            return _error(exc)
        ready_only = bool(body.get("ready")) if isinstance(body, dict) else False
        rows = []
        for row in service.repository_index(ready_only):
            entry = {"name": row.name}
            if row.version:
                entry["version"] = row.version
            if row.state:
                entry["state"] = row.state
            if row.reason:
                entry["reason"] = row.reason
            rows.append(entry)
        return JSONResponse(rows)

    async def repository_load(request: Request) -> Response:
        try:
            body = await json_body(request)
            parameters = body.get("parameters") if isinstance(body, dict) else None
            refuse_load_overrides(parameters or {})
            await service.load_model(request.path_params["model"])
        except TritonError as exc:
            return _error(exc)
        return Response(status_code=200)

    async def repository_unload(request: Request) -> Response:
        try:
            await json_body(request)
            await service.unload_model(request.path_params["model"])
        except TritonError as exc:
            return _error(exc)
        return Response(status_code=200)

    model_routes = []
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        model_routes += [
            Route(prefix, model_metadata, methods=["GET"]),
            Route(prefix + "/ready", model_ready, methods=["GET"]),
            Route(prefix + "/config", model_config, methods=["GET"]),
            Route(prefix + "/stats", model_stats, methods=["GET"]),
            Route(prefix + "/infer", infer, methods=["POST"]),
            Route(prefix + "/generate", generate, methods=["POST"]),
            Route(prefix + "/generate_stream", generate_stream, methods=["POST"]),
        ]
    routes = [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2/models/stats", model_stats, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", repository_load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", repository_unload, methods=["POST"]),
        *model_routes,
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(BoundedBody, limit=body_limit, error_body=_limit_error)],
        exception_handlers={Exception: _internal_error},
    )
