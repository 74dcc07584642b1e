"""Who did something, as recorded in the audit trail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Actor:
    label: str
    user: Any = None

    @classmethod
    def for_request(cls, user: Any, auth: Any = None) -> Actor:
        from portal.accounts.models import ApiToken

        if isinstance(auth, ApiToken):
            return cls(label=f"token:{auth.name} ({auth.prefix})", user=auth.created_by)
        return cls(label=f"user:{user.get_username()}", user=user)

    @classmethod
    def operator(cls, user: Any) -> Actor:
        return cls(label=f"operator:{user.get_username()}", user=user)


CONTROLLER = Actor(label="controller")
