"""The errors services raise. The API turns each into one consistent JSON body; forms show them.

Services never return error codes: they raise one of these, or Django's ``ValidationError``
keyed by field for bad input.
"""

from __future__ import annotations


class ApplicationError(Exception):
    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, detail: dict | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.detail = detail or {}


class Conflict(ApplicationError):
    """The request is well formed but the object's current state does not allow it."""

    status_code = 409
    code = "conflict"


class InvalidTransition(Conflict):
    code = "invalid_transition"


class QuotaExceeded(ApplicationError):
    """The request would take the team past a quota an operator set."""

    status_code = 403
    code = "quota_exceeded"


class Unavailable(ApplicationError):
    """Something the answer depends on (a cluster's API, a log source) did not answer: try
    again later."""

    status_code = 503
    code = "unavailable"
