"""The browser test runs in the rollout tests' world (gateway, worker, real instances); the deploy
form's tests share its URL and a valid set of its fields."""

import pytest
from django.urls import reverse

from tests.deployments.conftest import demo_weights, rollout_world  # noqa: F401


@pytest.fixture
def deploy_url(team, model) -> str:
    return reverse("web:deploy", args=[team.slug, model.slug])


@pytest.fixture
def deploy_fields(version, cpu_instance_type) -> dict:
    """The deploy form's fields for a valid Red-Black deploy of ``version``."""
    return {
        "version": version.pk,
        "strategy": "red_black",
        "replicas": 1,
        "instance_type": cpu_instance_type.pk,
        "stages": "10, 50, 100",
        "bake_seconds": 60,
        "health_deadline_seconds": 600,
        "max_error_rate": 0.05,
    }
