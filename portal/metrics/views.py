"""The portal's own ``/metrics`` for Prometheus (no login: it holds no team data)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from portal.metrics.own import exposition


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
