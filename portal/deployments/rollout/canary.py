"""Canary analysis of a bake: read both versions' per-request observations over the bake's
window from their instances (OpenAI requests) and the gateways (KServe requests), judge the new version against the old (:mod:`.judge`), and keep
the analysis (:class:`~portal.deployments.models.StageAnalysis`).

The observations come from each instance's serving front end (``GET /observations``, see
:mod:`serving.frontend.observations`), read once, at the end of the bake: the front end keeps
them in a ring, so nothing has to be collected while the bake runs and a worker killed in
between loses nothing. The ring bounds how far back that reaches (20,000 requests per instance
by default, sampled above 200 per second): a bake longer than that is judged on its last part,
and the analysis says so (``sample``'s ``truncated``).

Only a stage that splits the traffic is judged: at 100% the old version takes no requests, so
there is nothing of the same minutes to compare with (:func:`judged_stage`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from portal.deployments.models import Deployment, StageAnalysis
from portal.deployments.rollout.judge import Analysis, CanaryPolicy, Observations, judge
from portal.registry.models import ModelVersion

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 5.0
#: Pages of one instance's ring read at most (5,000 observations each): the ring's default
#: size, with room for a larger one.
MAX_PAGES = 10


@dataclass
class Side:
    """One version's observations over the window, and how completely they were read."""

    records: list[dict[str, Any]] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    #: An instance's ring no longer reached back to the window's start.
    truncated: bool = False
    #: Of ``records``, the KServe requests the gateways observed.
    kserve: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.records),
            "kserve_requests": self.kserve,
            "instances": self.instances,
            "unread": self.unread,
            "truncated": self.truncated,
        }

    def add_gateway_records(self, records: list[dict[str, Any]]) -> None:
        self.records += records
        self.kserve += len(records)


def judged_stage(percent: int | None) -> bool:
    """Whether a stage's bake can be judged: both versions take part of the traffic."""
    return percent is not None and 0 < percent < 100


def read_instance(url: str, since: float, until: float) -> tuple[list[dict[str, Any]], bool]:
    """The observations of the front end at ``url`` (its OpenAI base URL) that ended within
    ``[since, until]``, and whether its ring had already dropped some of that window. Raises
    ``httpx.HTTPError`` when it cannot be read."""
    found: list[dict[str, Any]] = []
    after, truncated = 0, False
    with httpx.Client(timeout=READ_TIMEOUT_SECONDS) as client:
        for page in range(MAX_PAGES):
            answer = client.get(f"{url}/observations", params={"after": after})
            answer.raise_for_status()
            body = answer.json()
            batch = body["observations"]
            if page == 0 and body["lost"] and (not batch or batch[0]["at"] > since):
                truncated = True  # what left the ring may have been in the window
            found += [o for o in batch if since <= o["at"] <= until]
            if not batch or body["next"] >= body["last"] or batch[-1]["at"] > until:
                break
            after = body["next"]
    return found, truncated


def read_side(rows: Iterable[Any], since: float, until: float) -> Side:
    """Every ready instance's observations of one version, read in parallel."""
    rows = [row for row in rows if row.endpoints.get("openai")]
    side = Side(instances=[row.name for row in rows])
    if not rows:
        return side

    def one(row: Any) -> tuple[str, list[dict[str, Any]], bool] | None:
        try:
            records, truncated = read_instance(row.endpoints["openai"], since, until)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            log.warning("reading %s's observations failed: %r", row.name, exc)
            return None
        return row.name, records, truncated

    with ThreadPoolExecutor(max_workers=min(8, len(rows))) as pool:
        for row, result in zip(rows, pool.map(one, rows), strict=True):
            if result is None:
                side.unread.append(row.name)
                continue
            side.records += result[1]
            side.truncated |= result[2]
    return side


@dataclass(frozen=True)
class BakeJudgement:
    """A bake's analysis with the observations it was made from."""

    policy: CanaryPolicy
    analysis: Analysis
    baseline: Side
    canary: Side
    since: float
    until: float


def judge_bake(
    policy: CanaryPolicy,
    baseline_rows: Iterable[Any],
    canary_rows: Iterable[Any],
    since: float,
    until: float,
    *,
    gateway_records: list[dict[str, Any]] | None = None,
    labels: tuple[str, str] = ("", ""),
) -> BakeJudgement:
    """Read both versions' instances over ``[since, until]`` and judge the new one. The
    OpenAI requests come from the instances' front ends; ``gateway_records`` are the KServe
    requests the gateways observed on the route, each side taking those of its version's
    label (``labels``: baseline's, canary's, as ``v1``)."""
    old = read_side(baseline_rows, since, until)
    new = read_side(canary_rows, since, until)
    for side, label in zip((old, new), labels, strict=True):
        side.add_gateway_records([r for r in gateway_records or () if r.get("version") == label])
    analysis = judge(
        policy, Observations.from_records(old.records), Observations.from_records(new.records)
    )
    return BakeJudgement(policy, analysis, old, new, since, until)


def kept(deployment: Deployment, until: float) -> StageAnalysis | None:
    """The analysis already kept for the deployment's current stage and window ending at
    ``until``, if any: the controller then acts on it rather than judging the bake again."""
    return StageAnalysis.objects.filter(
        deployment=deployment,
        stage=deployment.current_stage,
        canary_version=deployment.target_version.number,
        window_end=datetime.fromtimestamp(until, tz=UTC),
    ).first()


def keep(
    deployment: Deployment, judgement: BakeJudgement, baseline: ModelVersion, action: str
) -> StageAnalysis:
    """Store the analysis of the deployment's current stage, with what the rollout did."""
    analysis = judgement.analysis
    return StageAnalysis.objects.create(
        deployment=deployment,
        stage=deployment.current_stage,
        percent=deployment.stage_percent or 0,
        baseline_version=baseline.number,
        canary_version=deployment.target_version.number,
        window_start=datetime.fromtimestamp(judgement.since, tz=UTC),
        window_end=datetime.fromtimestamp(judgement.until, tz=UTC),
        decision=analysis.decision,
        action=action,
        score=analysis.score,
        reason=analysis.reason,
        verdicts=[v.to_dict() for v in analysis.verdicts],
        sample={"baseline": judgement.baseline.summary(), "canary": judgement.canary.summary()},
        policy=judgement.policy.to_dict(),
    )
