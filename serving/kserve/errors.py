"""Triton's error codes and how each protocol reports them.

Triton maps its core error codes onto gRPC status codes (``src/grpc/grpc_utils.cc``
``GrpcStatusUtil::CodeToStatus``) and HTTP status codes (``src/http_server.cc``
``HttpCodeFromError``); clients branch on those, so both tables are copied here exactly.
"""

from __future__ import annotations

import enum

import grpc


class Code(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    # Not one of Triton's codes: a request over the server's size limit (HTTP 413; gRPC's own
    # message size limit answers RESOURCE_EXHAUSTED, as here).
    TOO_LARGE = "TOO_LARGE"


_GRPC = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
    Code.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
_HTTP = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.TOO_LARGE: 413,
}


class TritonError(Exception):
    """An error as Triton would report it: a core code and a message."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return _GRPC[self.code]

    @property
    def http_status(self) -> int:
        # INVALID_ARG, UNKNOWN, ALREADY_EXISTS and CANCELLED have no closer HTTP code: 400.
        return _HTTP.get(self.code, 400)


def invalid(message: str) -> TritonError:
    return TritonError(Code.INVALID_ARG, message)
