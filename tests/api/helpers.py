"""Assertions shared by the API tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from portal.core.models import IdempotencyRecord
from portal.deployments.models import Deployment, DeploymentEvent
from portal.registry.models import Model, ModelVersion


def row_counts() -> dict[str, int]:
    tables = (Model, ModelVersion, Deployment, DeploymentEvent, IdempotencyRecord)
    return {table.__name__: table.objects.count() for table in tables}


@contextmanager
def nothing_created() -> Iterator[None]:
    """Fails if the block created (or deleted) any domain row: a refused call leaves no trace."""
    before = row_counts()
    yield
    assert row_counts() == before


def api_error(response, status: int, code: str) -> dict:
    """The ``error`` object of a failed call, after checking its status, shape and code."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def ok(response, status: int = 200) -> dict:
    assert response.status_code == status, response.content
    return response.json()
