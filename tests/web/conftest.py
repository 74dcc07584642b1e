"""The browser test runs in the rollout tests' world (gateway, worker, real instances)."""

from tests.deployments.conftest import demo_weights, rollout_world  # noqa: F401
