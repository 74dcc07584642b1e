"""What a deployment costs to run, estimated from its instance type's operator-set price.

Plain arithmetic over values the caller already has (no queries), so the deploy form, the
deployment page and the API say the same numbers. Nothing here is a bill: the price is what an
operator typed, and the estimate counts instances, not the time they actually ran.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from portal.deployments.models import LIVE_STATES, Deployment, Instance

#: Hours in the month the monthly figure assumes (365 * 24 / 12), as cloud price lists do.
HOURS_PER_MONTH = 730

#: Instance states that hold a machine: everything started and not yet stopped or failed.
BILLED_STATES = frozenset({"pending", "starting", "ready", "unhealthy", "draining"})


@dataclass(frozen=True)
class CostEstimate:
    instances: int
    per_hour: Decimal
    per_month: Decimal


def estimate(
    price_per_hour: Decimal | None, replicas: int, live_states: Iterable[str] | None = None
) -> CostEstimate | None:
    """The hourly and monthly (730 h) cost of ``replicas`` instances at ``price_per_hour``;
    None when the type has no price (an estimate of zero would read as "free").

    ``live_states``, the states of a deployment's instances, counts what actually holds a
    machine when that is more than the replicas: during a Red-Black rollout, or until a
    Versioned deployment's old version is cleaned up, both versions' instances run. Fewer live
    instances than replicas (still starting) count as the replicas, which they are about to be.
    """
    if price_per_hour is None:
        return None
    live = sum(1 for state in live_states or () if state in BILLED_STATES)
    instances = max(replicas, live)
    per_hour = price_per_hour * instances
    return CostEstimate(instances, per_hour, per_hour * HOURS_PER_MONTH)


def deployment_estimate(
    deployment: Deployment, instances: Iterable[Instance]
) -> CostEstimate | None:
    """What ``deployment`` costs now: its replicas (and any extra live instances) while it is
    live, nothing once it is retired, aborted or failed (its instances are gone)."""
    replicas = deployment.replicas if deployment.observed_state in LIVE_STATES else 0
    return estimate(deployment.instance_type.price_per_hour, replicas, (i.state for i in instances))


def dollars(amount: Decimal) -> str:
    """``$1,234.57``: to the cent, halves rounded up (as static/web/cost_estimate.js does, so
    the page does not change the figure when its script takes over)."""
    return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"


#: What the pages say when a type has no price (an operator has not set one).
NO_PRICE = "no price set for this type"


def summary(cost: CostEstimate | None) -> str:
    """The estimate in one line, as the deploy form and the deployment page write it."""
    if cost is None:
        return NO_PRICE
    plural = "" if cost.instances == 1 else "s"
    return (
        f"≈ {dollars(cost.per_hour)}/hour · {dollars(cost.per_month)}/month "
        f"for {cost.instances} instance{plural}"
    )
