"""The platform gateway's side of a launcher: routes become the routing table in Redis that
every gateway process follows (:mod:`serving.gateway.table`).

Both launchers route through it by default: the local one to its processes, the Kubernetes
one to its pods' addresses (the gateway then runs in the cluster as its own Deployment, see
:func:`.k8s_objects.gateway_objects`). Going through the platform's gateway is what makes a
model's traffic check caller keys and rate limits, and what records each route's last call for
the Versioned clean-up.
"""

from __future__ import annotations

from typing import Any

import redis

from portal.deployments.runtime.launchers.base import Route
from serving.gateway import observations, table


class GatewayRoutes:
    """Publish routes to, and read back from, the gateways that follow ``prefix`` in Redis."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    def publish(self, routes: list[Route]) -> int:
        """Make ``routes`` the whole table (each version a weighted group of its ready
        instances); returns the table's generation."""
        entries = [
            table.RouteEntry(
                path=route.path,
                groups=[
                    table.Group(
                        label=f"v{share.version_set.version}",
                        weight=share.weight,
                        backends=[
                            table.Backend(
                                name=instance.name,
                                openai=instance.endpoints.get("openai"),
                                kserve_http=instance.endpoints.get("kserve_http"),
                            )
                            for instance in share.instances
                        ],
                    )
                    for share in route.shares
                ],
                wake=route.deployment_id if route.wake else None,
            )
            for route in routes
        ]
        return table.publish(self.redis, entries, prefix=self.prefix)

    def applied(self, generation: int) -> bool:
        """Every live gateway process runs ``generation`` or newer (none live: nothing routes
        to the old instances)."""
        applied = table.applied_generation(self.redis, prefix=self.prefix)
        return applied is None or applied >= generation

    def last_requests(self) -> dict[str, float]:
        return table.last_requests(self.redis, prefix=self.prefix)

    def observations(self, route: str, since: float, until: float) -> list[dict[str, Any]]:
        """The KServe inference requests the gateways observed on ``route`` in the window
        (:mod:`serving.gateway.observations`)."""
        return observations.read(self.redis, self.prefix, route, since, until)
