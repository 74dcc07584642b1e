"""The portal's ASGI application, which gunicorn serves through uvicorn's worker
(:mod:`portal.gunicorn_conf`).

ASGI, not WSGI, so that a request that waits (following an instance's log) waits on the event
loop and holds no thread; Django runs every other (synchronous) view on a thread of its own per
request. Two things differ from WSGI and are settled here:

- Every synchronous request runs on a thread of its own, so the number of threads is the
  number of requests in flight, and with a connection per thread a burst of requests would
  open connections until PostgreSQL refuses more ("too many clients"). The web server takes
  its connections from a pool instead (``DATABASE_POOL_MAX_SIZE``, 10 per process by default),
  and keeps none in a thread between requests (``DATABASE_CONN_MAX_AGE`` 0: a thread ends with
  its request, and a connection kept there would stay open until it is collected).
- Django's ASGI handler reads a request's whole body (spooling it to disk) before any view or
  limit looks at it. :class:`~portal.core.body_limit.BodyLimit` refuses a body over ``WEB_MAX_BODY_BYTES`` first, as
  its ``Content-Length`` says or as it arrives, with the API's 413.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DATABASE_CONN_MAX_AGE", "0")
os.environ.setdefault("DATABASE_POOL_MAX_SIZE", "10")

from django.conf import settings
from django.core.asgi import get_asgi_application

django_application = get_asgi_application()  # sets Django up: import the portal's code below

from portal.core.body_limit import BodyLimit  # noqa: E402 (needs Django set up)

application = BodyLimit(django_application, settings.WEB_MAX_BODY_BYTES)
