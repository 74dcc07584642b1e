"""The worker class gunicorn runs the portal with: uvicorn's, serving :mod:`portal.asgi`.

Loaded by gunicorn's master before Django's settings exist, so it must not import Django.
"""

from __future__ import annotations

from uvicorn_worker import UvicornWorker


class PortalWorker(UvicornWorker):
    CONFIG_KWARGS = {
        **UvicornWorker.CONFIG_KWARGS,
        # Django answers no ASGI lifespan events; asking would only log that it does not.
        "lifespan": "off",
        # On SIGTERM, requests in flight (a log follow waits at most 20 s) get this long to
        # finish, inside gunicorn's graceful_timeout, before their connections are closed.
        "timeout_graceful_shutdown": 18,
    }
