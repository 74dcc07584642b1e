"""The KServe v2 gRPC service (``inference.GRPCInferenceService``) as Triton answers it.

vLLM-backend models are decoupled, so, as in Triton (``src/grpc/infer_handler.cc``), unary
``ModelInfer`` refuses them with ``UNIMPLEMENTED`` and inference goes through the
bidirectional ``ModelStreamInfer``. Each request on a stream runs as its own task, so requests
on one stream (and on many streams) reach the engine together and are batched there.
Every streamed response carries the ``triton_final_response`` parameter
(``src/grpc/stream_infer_handler.cc``). ``triton_enable_empty_final_response`` is accepted
(a bool, as Triton checks); like Triton with the vLLM backend it never produces an extra
response, because the backend's last response always carries the final flag with its data.
Errors on a stream travel as ``error_message`` of a response, not as a status, as in Triton.

Python-backend models: a non-decoupled one answers ``ModelInfer`` (one response, errors as a
status with Triton's code) and ``ModelStreamInfer`` alike; a decoupled one only the stream,
where an error response of the model is an ``error_message`` and the stream goes on, and a
final response without outputs is sent only when the client set
``triton_enable_empty_final_response``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from serving.kserve.contract import Tensor
from serving.kserve.errors import Code, TritonError, invalid
from serving.kserve.grpc_codec import decode_inputs, encode_outputs, parameters_of
from serving.kserve.service import InferenceService
from serving.kserve.triton_metrics import ModelStats

logger = logging.getLogger("serving.kserve")

SERVER_NAME = "triton"
# The protocol this server speaks is that of the Triton release matching the pinned client.
SERVER_VERSION = importlib.metadata.version("tritonclient")
EXTENSIONS = ("model_configuration", "model_repository", "statistics", "parameters")
DECOUPLED_MESSAGE = "ModelInfer RPC doesn't support models with decoupled transaction policy"
_MAX_MESSAGE = 2**31 - 1
_END = object()


def _stats_message(stats: ModelStats) -> pb.ModelStatistics:
    def duration(d: Any) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=d.count, ns=d.ns)

    return pb.ModelStatistics(
        name=stats.name,
        version=stats.version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=duration(stats.success),
            fail=duration(stats.fail),
            queue=duration(stats.queue),
            compute_input=duration(stats.compute_input),
            compute_infer=duration(stats.compute_infer),
            compute_output=duration(stats.compute_output),
        ),
    )


class KServeServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: InferenceService) -> None:
        self.service = service

    # --- health and metadata ------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        ready = await self.service.model_ready(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=list(EXTENSIONS)
        )

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        try:
            meta = self.service.metadata(request.name, request.version)
        except TritonError as exc:
            await context.abort(exc.grpc_status, exc.message)
        return json_format.ParseDict(meta, pb.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        try:
            model = self.service.get(request.name, request.version)
        except TritonError as exc:
            await context.abort(exc.grpc_status, exc.message)
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(model.config)
        return response

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        if request.name:
            try:
                self.service.get(request.name, request.version)
            except TritonError as exc:
                await context.abort(exc.grpc_status, exc.message)
        stats = [
            s for s in self.service.stats.snapshot() if not request.name or s.name == request.name
        ]
        return pb.ModelStatisticsResponse(model_stats=[_stats_message(s) for s in stats])

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        models = [
            pb.RepositoryIndexResponse.ModelIndex(
                name=row.name, version=row.version, state=row.state, reason=row.reason
            )
            for row in self.service.repository_index(ready_only=request.ready)
        ]
        return pb.RepositoryIndexResponse(models=models)

    async def RepositoryModelLoad(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        try:
            refuse_load_overrides(parameters_of(request.parameters))
            await self.service.load_model(request.model_name)
        except TritonError as exc:
            await context.abort(exc.grpc_status, exc.message)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        try:
            await self.service.unload_model(request.model_name)
        except TritonError as exc:
            await context.abort(exc.grpc_status, exc.message)
        return pb.RepositoryModelUnloadResponse()

    # --- inference ----------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        try:
            started = time.monotonic_ns()
            model = self.service.get(request.model_name, request.model_version)
            if model.decoupled:  # every vLLM-backend model, and decoupled Python ones
                raise TritonError(Code.UNSUPPORTED, DECOUPLED_MESSAGE)
            tensors = decode_inputs(request)
            last = await self.service.infer_unary(
                model,
                tensors,
                parameters_of(request.parameters),
                request.id,
                [o.name for o in request.outputs],
                input_ns=time.monotonic_ns() - started,
            )
        except TritonError as exc:
            await context.abort(exc.grpc_status, exc.message)
            raise AssertionError("unreachable") from None  # context.abort raises
        message = pb.ModelInferResponse(
            model_name=model.name, model_version=model.version, id=request.id
        )
        encode_outputs(message, last.outputs)
        return message

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        out: asyncio.Queue[Any] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def handle(request: pb.ModelInferRequest) -> None:
            async for response in self._stream_one(request):
                await out.put(response)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(handle(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                # The client half-closed: finish what it asked for, then end the stream.
                while tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                await out.put(_END)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await out.get()
                if item is _END:
                    break
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()  # the client went away: abort its requests in the engine

    async def _stream_one(
        self, request: pb.ModelInferRequest
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        model_name, request_id = request.model_name, request.id
        version = request.model_version
        try:
            started = time.monotonic_ns()
            model = self.service.get(model_name, version)
            version = model.version
            parameters = parameters_of(request.parameters)
            empty_final = parameters.get("triton_enable_empty_final_response")
            if empty_final is not None and not isinstance(empty_final, bool):
                raise invalid(
                    "invalid value type for 'triton_enable_empty_final_response' parameter, "
                    "expected bool_param."
                )
            tensors: dict[str, Tensor] = decode_inputs(request)
            requested = [o.name for o in request.outputs]
            responses = self.service.infer(
                model,
                tensors,
                parameters,
                request_id,
                requested,
                input_ns=time.monotonic_ns() - started,
            )
            async for response in responses:
                flag_only = response.final and not response.outputs and response.error is None
                if flag_only and not empty_final:  # a decoupled Python model's last response
                    continue
                message = pb.ModelInferResponse(
                    model_name=model_name, model_version=version, id=request_id
                )
                encode_outputs(message, response.outputs)
                message.parameters["triton_final_response"].bool_param = response.final
                if response.error is not None:
                    yield pb.ModelStreamInferResponse(
                        error_message=response.error.message, infer_response=message
                    )
                else:
                    yield pb.ModelStreamInferResponse(infer_response=message)
        except TritonError as exc:
            message = pb.ModelInferResponse(
                model_name=model_name, model_version=version, id=request_id
            )
            message.parameters["triton_final_response"].bool_param = True
            yield pb.ModelStreamInferResponse(error_message=exc.message, infer_response=message)
        except Exception:  # never let one request's bug end everyone's stream
            # The traceback goes to the log; the caller learns nothing of the code.
            logger.exception("stream request %s failed", request_id)
            error = TritonError(Code.INTERNAL, "internal error")
            yield pb.ModelStreamInferResponse(error_message=error.message)


def refuse_load_overrides(parameters: dict[str, Any]) -> None:
    """Triton's load may carry a replacement ``config`` and ``file:`` contents; the CPU engine
    loads only what the repository holds, so those are refused rather than ignored."""
    if parameters:
        raise invalid(
            f"load parameters {sorted(parameters)} are not supported: the CPU engine loads "
            "models only as the repository holds them"
        )


async def start_grpc_server(service: InferenceService, host: str, port: int) -> tuple[Any, int]:
    """Start serving; return the server and the port it bound (``port`` may be 0)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeServicer(service), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the gRPC port {host}:{port}")
    await server.start()
    return server, bound
