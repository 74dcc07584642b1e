"""``Idempotency-Key`` support for creating calls, so a retried CI call creates nothing twice.

The first successful answer is stored with the caller and key, inside the same transaction as
whatever the call created. A retry replays it. Two concurrent calls with one key both run, but
the second cannot store its answer (unique key), so its transaction, and everything it created,
rolls back and it replays the first call's answer.
"""

from __future__ import annotations

import functools
import hashlib
import json

from django.db import IntegrityError, transaction
from rest_framework.response import Response

from portal.accounts.models import ApiToken
from portal.api.errors import error_body
from portal.core.models import IdempotencyRecord

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255


def _principal(request) -> str:
    if isinstance(request.auth, ApiToken):
        return f"token:{request.auth.pk}"
    return f"user:{request.user.pk}"


def _fingerprint(request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{request.method}\n{request.path}\n{body}".encode()).hexdigest()


def _replay(record: IdempotencyRecord, fingerprint: str) -> Response:
    if record.fingerprint != fingerprint:
        return Response(
            error_body(
                "idempotency_key_reused",
                f"{HEADER} {record.key!r} was already used for a different request "
                f"({record.method} {record.path}); use a new key for a new request.",
            ),
            status=422,
        )
    response = Response(record.response_body, status=record.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


def idempotent(view_method):
    """Wrap a DRF view method that creates something."""

    @functools.wraps(view_method)
    def wrapper(self, request, *args, **kwargs):
        key = request.headers.get(HEADER)
        if key is None:
            return view_method(self, request, *args, **kwargs)
        if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
            return Response(
                error_body(
                    "invalid", f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable characters."
                ),
                status=400,
            )
        principal, fingerprint = _principal(request), _fingerprint(request)
        try:
            with transaction.atomic():
                existing = IdempotencyRecord.objects.filter(principal=principal, key=key).first()
                if existing is not None:
                    return _replay(existing, fingerprint)
                response = view_method(self, request, *args, **kwargs)
                if 200 <= response.status_code < 300:
                    IdempotencyRecord.objects.create(
                        principal=principal,
                        key=key,
                        method=request.method,
                        path=request.path,
                        fingerprint=fingerprint,
                        status_code=response.status_code,
                        response_body=json.loads(json.dumps(response.data, default=str)),
                    )
                return response
        except IntegrityError:
            existing = IdempotencyRecord.objects.filter(principal=principal, key=key).first()
            if existing is None:
                raise
            return _replay(existing, fingerprint)

    return wrapper
