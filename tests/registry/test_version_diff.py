"""The deploy form's version diff: every field that differs, interface changes marked."""

from __future__ import annotations

import pytest
from django.urls import reverse

from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import ObservedState
from portal.registry.diff import Change, version_diff
from portal.registry.models import VersionState
from tests.factories import TAGGER_IO, make_deployment, make_python_version, make_version
from tests.web.test_pages import signed_in

pytestmark = pytest.mark.django_db


def test_identical_settings_show_no_change(model, artifact_root, release):
    v1 = make_version(model, artifact_root)
    v2 = make_version(model, artifact_root)
    assert version_diff(v1, v2) == []


def test_engine_arguments_and_source_changes_are_listed_one_by_one(
    model, artifact_root, release, tmp_path
):
    v1 = make_version(model, artifact_root, engine_args={"dtype": "auto", "max_model_len": 2048})
    (artifact_root / "ranker-2").mkdir()
    v2 = make_version(
        model,
        artifact_root,
        artifact_uri=f"file://{artifact_root}/ranker-2",
        engine_args={"dtype": "auto", "max_model_len": 4096, "enforce_eager": True},
    )
    assert version_diff(v1, v2) == [
        Change(
            "artifact source", f"file://{artifact_root}/ranker", f"file://{artifact_root}/ranker-2"
        ),
        Change("engine argument enforce_eager", "—", "true"),
        Change("engine argument max_model_len", "2048", "4096"),
    ]


def test_an_interface_change_is_marked(model, artifact_root, release):
    v1 = make_python_version(model, artifact_root, TAGGER_IO)
    v2 = make_python_version(
        model,
        artifact_root,
        {
            **TAGGER_IO,
            "inputs": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}],
            "max_batch_size": 8,
        },
    )
    changes = version_diff(v1, v2)
    assert Change("input TEXT", "STRING [1]", "STRING [-1]", interface=True) in changes
    assert Change("max batch size", "—", "8", interface=True) in changes
    assert all(c.interface for c in changes)


def test_the_deploy_form_shows_the_diff_against_the_serving_version(
    member, team, model, artifact_root, release, cpu_instance_type
):
    v1 = make_version(model, artifact_root, engine_args={"max_model_len": 2048})
    deployment = make_deployment(model, v1, cpu_instance_type)
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="starting")
    transition_deployment(deployment, ObservedState.SERVING, reason="serving", traffic={1: 100})
    v2 = make_version(model, artifact_root, engine_args={"max_model_len": 4096})
    type(v2).objects.filter(pk=v2.pk).update(state=VersionState.READY)
    url = reverse("web:deploy", args=[team.slug, model.slug]) + "?version=2"
    html = signed_in(member).get(url).content.decode()
    assert "What changes: v1 (serving) → v2" in html
    assert "engine argument max_model_len" in html
    assert '<code>2048</code></td><td class="wrap"><code>4096</code>' in html
