"""Cost estimates (portal.deployments.costs): what they count, and how they are written."""

from __future__ import annotations

from decimal import Decimal

import pytest

from portal.deployments import costs
from portal.deployments.models import Instance, InstanceState, InstanceType, ObservedState
from tests.factories import make_version

#: The multiplication sign the spec lines and the page write.
X = "\u00d7"


def test_no_price_no_estimate():
    assert costs.estimate(None, 3) is None
    assert costs.summary(None) == "no price set for this type"


def test_replicas_times_price_per_hour_and_730_hours_a_month():
    cost = costs.estimate(Decimal("9.8000"), 2)
    assert cost == costs.CostEstimate(2, Decimal("19.6"), Decimal("14308"))
    assert costs.summary(cost) == "≈ $19.60/hour · $14,308.00/month for 2 instances"
    assert costs.summary(costs.estimate(Decimal("0.0500"), 1)) == (
        "≈ $0.05/hour · $36.50/month for 1 instance"
    )


def test_a_rollout_counts_both_versions_live_instances():
    states = ["ready", "ready", "starting", "draining", "stopped", "failed"]
    cost = costs.estimate(Decimal("1.0000"), 2, states)
    assert cost is not None and cost.instances == 4  # stopped and failed hold no machine


def test_instances_still_starting_count_as_the_replicas():
    cost = costs.estimate(Decimal("1.0000"), 3, ["starting"])
    assert cost is not None and cost.instances == 3


@pytest.mark.parametrize(
    ("amount", "written"),
    [("0.005", "$0.01"), ("0.0049", "$0.00"), ("1234567.891", "$1,234,567.89"), ("0", "$0.00")],
)
def test_dollars_round_half_up_to_the_cent(amount, written):
    assert costs.dollars(Decimal(amount)) == written


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (dict(accelerator="nvidia-h100", gpus=2, cpus=16, memory_gib=200),
         f"2 {X} nvidia-h100 · 16 vCPU · 200 GiB"),
        (dict(accelerator="", gpus=0, cpus=2, memory_gib=8), "CPU · 2 vCPU · 8 GiB"),
        (dict(accelerator="", gpus=1, cpus=4, memory_gib=16), f"1 {X} GPU · 4 vCPU · 16 GiB"),
    ],
)  # fmt: skip
def test_spec_line(fields, line):
    assert InstanceType(name="t", **fields).spec_line == line


@pytest.mark.django_db
def test_a_deployment_costs_its_live_instances_while_live_and_nothing_once_retired(
    deployment, artifact_root
):
    deployment.instance_type.price_per_hour = Decimal("0.5000")
    deployment.instance_type.save()
    v2 = make_version(deployment.model, artifact_root)
    for name, version in (("a", deployment.target_version), ("b", v2)):
        Instance.objects.create(
            deployment=deployment, version=version, name=name, state=InstanceState.READY
        )
    cost = costs.deployment_estimate(deployment, deployment.instances.all())
    assert cost is not None and (cost.instances, cost.per_hour) == (2, Decimal("1.0"))

    Instance.objects.update(state=InstanceState.STOPPED)
    deployment.observed_state = ObservedState.RETIRED
    cost = costs.deployment_estimate(deployment, deployment.instances.all())
    assert cost is not None and (cost.instances, cost.per_hour) == (0, Decimal("0"))


@pytest.mark.django_db
def test_the_seeded_gpu_type_has_an_example_price_and_cpu_local_none():
    assert InstanceType.objects.get(name="gpu-a10g-1").price_per_hour == Decimal("1.2120")
    assert InstanceType.objects.get(name="cpu-local").price_per_hour is None
