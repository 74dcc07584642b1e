from django.http import JsonResponse
from django.views.decorators.cache import never_cache

from portal.core import health


@never_cache
def healthz(request):
    """200 when the database, broker, a worker and beat all answer; 503 (with reasons) otherwise."""
    ok, checks = health.report()
    return JsonResponse(
        {"status": "ok" if ok else "unhealthy", "checks": checks}, status=200 if ok else 503
    )


@never_cache
def livez(request):
    """Liveness of this web process alone (and its database), for a load balancer: a dead worker
    or beat should page someone, not take every web server out of rotation."""
    check = health.check_database()
    return JsonResponse(
        {"status": "ok" if check.ok else "unhealthy", "database": check.detail},
        status=200 if check.ok else 503,
    )
