from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from portal.core import health


@never_cache
def healthz(request):
    """200 when the database, broker, a worker and beat all answer; 503 (with reasons) otherwise."""
    ok, checks = health.report()
    return JsonResponse(
        {"status": "ok" if ok else "unhealthy", "checks": checks}, status=200 if ok else 503
    )


def home(request):
    return render(request, "home.html")
