"""The API answers as its OpenAPI schema says: every operation, generated from the schema alone
(Schemathesis's examples, coverage, fuzzing and stateful phases), with a fixed seed and a
bounded number of examples, and no failure of the conformance checks."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter

import pytest

from tests.factories import make_deployment, make_model, make_version

schemathesis = pytest.importorskip("schemathesis")

from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import Status, events, from_schema  # noqa: E402

# The engine calls the app from its own threads, which need committed data.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SEED = 20261205
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25"))  # 100+ for a deep run
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    # And the other way round: what the schema says is invalid, the server refuses.
    "negative_data_rejection",
)


#: The phases, in three runs that pytest-xdist can spread over the cores (one run of all four
#: was the suite's longest test). Examples and coverage go together: the schema has no examples.
PHASE_RUNS = {
    "coverage": ("examples", "coverage"),
    "fuzzing": ("fuzzing",),
    "stateful": ("stateful",),
}


def run_config(token: str, phases: tuple[str, ...]) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "headers": {"Authorization": f"Bearer {token}"},
            "workers": 1,
            "cache": {"enabled": False},
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
            "phases": {
                "examples": {"enabled": "examples" in phases},
                "coverage": {"enabled": "coverage" in phases},
                "fuzzing": {"enabled": "fuzzing" in phases},
                "stateful": {"enabled": "stateful" in phases, "max-steps": 50},
            },
            "checks": {
                "enabled": False,
                **{name: {"enabled": True} for name in CHECKS},
            },
        }
    )


@pytest.fixture
def platform(team, member_token, release, cpu_instance_type, artifact_root):
    """Objects for the generated calls to find: a model with a version, and a deployment."""
    model = make_model(team, "ranker")
    version = make_version(model, artifact_root)
    make_deployment(model, version, cpu_instance_type)
    return member_token


@pytest.fixture
def quiet_request_log():
    """Thousands of refused requests would each log a warning line."""
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("run", list(PHASE_RUNS))
def test_every_operation_conforms_to_the_schema(run, platform, quiet_request_log):
    from django.db import connections

    from portal.wsgi import application as portal

    def application(environ, start_response):
        """The portal, leaving no database connection behind in the engine's threads."""
        try:
            return portal(environ, start_response)
        finally:
            connections.close_all()

    config = run_config(platform, PHASE_RUNS[run])
    schema = schemathesis.openapi.from_wsgi(
        "/api/schema/?format=json",
        application,
        config=config,
        headers={"Authorization": f"Bearer {platform}"},
    )
    started = time.monotonic()
    failures: list[str] = []
    errors: list[str] = []
    cases: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            cases[event.label or "?"] += len(event.recorder.cases)
            phases[event.phase.value] += len(event.recorder.cases)
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        failures.append(
                            f"{event.phase.value} {event.label}: {check.name}: {failure.title}"
                            f"\n{failure.message}\n{check.failure_info.code_sample}"
                        )
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.title}: {event.info.message}")
        elif isinstance(event, events.FatalError):
            raise event.exception
        elif isinstance(event, events.EngineFinished):
            failures.extend(str(f) for f in event.failures)
    elapsed = time.monotonic() - started
    print(
        f"schemathesis: {len(cases)} operations, {sum(cases.values())} cases, "
        f"{len(failures)} failures, {len(errors)} errors in {elapsed:.0f} s; by phase: "
        + ", ".join(f"{phase} {count}" for phase, count in sorted(phases.items()))
    )
    summary = Counter(line.split("\n")[0] + " | " + line.split("\n")[1] for line in failures)
    for line, count in sorted(summary.items()):
        print(count, line)
    assert not errors, "\n".join(errors)
    unique = sorted(set(failures))
    assert not unique, f"{len(unique)} distinct failures:\n\n" + "\n\n".join(unique)
    if run != "stateful":  # every operation; the stateful phase follows links between them
        assert len(cases) >= 30
    for phase in PHASE_RUNS[run]:
        if phase != "examples":  # the schema has no examples
            assert phases[phase], f"the {phase} phase generated no case"
