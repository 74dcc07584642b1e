"""Counts and times every request for the portal's ``/metrics``."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from portal.metrics.own import HTTP_DURATION, HTTP_REQUESTS


def _view_name(request: HttpRequest) -> str:
    # The URL pattern's name, never the path: paths carry ids and slugs of teams' objects, and
    # every distinct path would be a new time series.
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    return match.view_name or "unnamed"


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        elapsed = time.perf_counter() - started
        view = _view_name(request)
        method = request.method if request.method in _METHODS else "other"
        HTTP_REQUESTS.labels(method, view, str(response.status_code)).inc()
        HTTP_DURATION.labels(method, view).observe(elapsed)
        return response


# Anything else a client sends as a method would be a label value of its choosing.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
