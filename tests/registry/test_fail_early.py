"""Failing early, in the services and the API: an instance type that cannot serve a version's
backend is refused at deploy, a ``file://`` source that is not there at registration, and a
failed version can be retried from a corrected source."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from portal.cache.services import content_store
from portal.core.actors import Actor
from portal.core.errors import Conflict
from portal.deployments.models import InstanceType
from portal.deployments.services import deploy, instance_types_for
from portal.registry.lifecycle import transition_version
from portal.registry.models import ApiSurface, VersionState
from portal.registry.services import (
    default_api_surface,
    not_deployable_reason,
    register_version,
    retry_version,
)
from portal.registry.validation import validate_artifact_uri
from tests.factories import TAGGER_IO, make_deployment, make_python_version, make_version

pytestmark = pytest.mark.django_db
ACTOR = Actor(label="user:test")


@pytest.fixture(autouse=True)
def _check_sources(settings):
    settings.ARTIFACT_FILE_CHECK_ON_REGISTER = True


def weights(root, name: str = "llm"):
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path


def failed(version, reason: str = "ranker does not exist on the worker."):
    transition_version(version, VersionState.FAILED, reason=reason)
    version.refresh_from_db()
    return version


# --- file:// sources ---------------------------------------------------------------------


def test_a_missing_file_source_is_refused_with_its_path(artifact_root):
    with pytest.raises(ValidationError) as caught:
        validate_artifact_uri(f"file://{artifact_root}/typo")
    assert caught.value.message_dict == {"artifact_uri": [f"{artifact_root}/typo does not exist."]}


def test_an_empty_directory_is_refused_and_a_file_or_a_directory_of_files_accepted(
    artifact_root,
):
    (artifact_root / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValidationError, match="holding no files"):
        validate_artifact_uri(f"file://{artifact_root}/empty")
    weights(artifact_root)
    (artifact_root / "one.gguf").write_bytes(b"x")
    assert validate_artifact_uri(f"file://{artifact_root}/llm")
    assert validate_artifact_uri(f"file://{artifact_root}/one.gguf")


def test_the_root_checks_still_come_first(artifact_root):
    with pytest.raises(ValidationError, match="outside the allowed artifact roots"):
        validate_artifact_uri("file:///etc")
    with pytest.raises(ValidationError, match=r"'\.\.' path segments"):
        validate_artifact_uri(f"file://{artifact_root}/../{artifact_root.name}")


def test_registering_a_missing_source_reports_it_with_the_other_fields(
    model, release, artifact_root
):
    with pytest.raises(ValidationError) as caught:
        register_version(
            model=model,
            artifact_uri=f"file://{artifact_root}/nope",
            engine_args={"no_such_arg": 1},
        )
    assert set(caught.value.message_dict) == {"artifact_uri", "engine_args"}
    assert not model.versions.exists()


def test_the_api_refuses_a_missing_source(api, member_token, model, release, artifact_root):
    answer = api(member_token).post(
        "/api/v1/versions/",
        {"model": model.pk, "artifact_uri": f"file://{artifact_root}/nope"},
        format="json",
    )
    assert answer.status_code == 400, answer.content
    assert "does not exist" in str(answer.json())
    assert "artifact_uri" in str(answer.json())


# --- API surface default ------------------------------------------------------------------


def test_a_python_version_defaults_to_kserve_only(api, member_token, model, release, artifact_root):
    weights(artifact_root, "tagger")
    answer = api(member_token).post(
        "/api/v1/versions/",
        {
            "model": model.pk,
            "artifact_uri": f"file://{artifact_root}/tagger",
            "backend": "python",
            "io_spec": TAGGER_IO,
        },
        format="json",
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["api_surface"] == ApiSurface.GRPC
    assert default_api_surface("vllm") == ApiSurface.OPENAI_GRPC


# --- instance types and backends ---------------------------------------------------------


@pytest.fixture
def python_version(model, release, artifact_root):
    weights(artifact_root, model.slug)
    return make_python_version(model, artifact_root, TAGGER_IO)


@pytest.fixture
def llm_only(db):
    return InstanceType.objects.create(name="gpu-llm", gpus=1, backends=["vllm"])


def test_existing_and_new_types_serve_both_backends(cpu_instance_type):
    assert InstanceType.objects.create(name="fresh").backends == ["vllm", "python"]
    assert cpu_instance_type.cannot_run("python") is None
    assert cpu_instance_type.cannot_run("vllm") is None


def test_triton_without_gpus_cannot_run_a_python_package(db):
    forced = InstanceType(name="triton-cpu", gpus=0, engine="tritonserver")
    assert "without a GPU" in (forced.cannot_run("python") or "")
    assert InstanceType(name="gpu", gpus=1).cannot_run("python") is None


def test_deploy_refuses_a_type_that_cannot_serve_the_backend(python_version, llm_only):
    with pytest.raises(ValidationError) as caught:
        deploy(
            model=python_version.model,
            strategy="red_black",
            version=python_version,
            instance_type=llm_only,
            actor=ACTOR,
        )
    assert list(caught.value.message_dict) == ["instance_type"]
    assert "gpu-llm serves vLLM" in caught.value.message_dict["instance_type"][0]
    assert not python_version.model.deployments.exists()


def test_the_deploy_form_offers_only_types_that_can_serve_it(
    python_version, llm_only, cpu_instance_type
):
    names = {t.name for t in instance_types_for(python_version)}
    assert cpu_instance_type.name in names and "gpu-llm" not in names
    assert "gpu-llm" in {t.name for t in instance_types_for(None)}


def test_a_red_black_rollout_onto_a_python_version_keeps_a_type_that_cannot_run_it(
    model, release, artifact_root, llm_only, python_version
):
    weights(artifact_root, "llm")
    llm = make_version(model, artifact_root, artifact_uri=f"file://{artifact_root}/llm")
    live = make_deployment(model, llm, llm_only)
    with pytest.raises(ValidationError) as caught:
        deploy(
            model=model,
            strategy="red_black",
            version=python_version,
            instance_type=llm_only,
            actor=ACTOR,
        )
    assert "instance_type" in caught.value.message_dict
    live.refresh_from_db()
    assert live.target_version_id == llm.pk


def test_the_api_answers_400_on_the_instance_type(api, member_token, python_version, llm_only):
    answer = api(member_token).post(
        "/api/v1/deployments/",
        {
            "model": python_version.model_id,
            "strategy": "versioned",
            "version": python_version.pk,
            "instance_type": "gpu-llm",
        },
        format="json",
    )
    assert answer.status_code == 400, answer.content
    assert "instance_type" in str(answer.json())
    assert "gpu-llm" in str(answer.json())


def test_instance_types_list_their_backends(api, member_token, llm_only):
    listed = api(member_token).get("/api/v1/instance-types/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert {r["name"]: r["backends"] for r in rows}["gpu-llm"] == ["vllm"]


# --- what can deploy -----------------------------------------------------------------------


def test_only_ready_versions_deploy_from_the_pages(python_version):
    assert "not ready yet" in (not_deployable_reason(python_version) or "")
    failed(python_version, "boom")
    assert "failed (boom)" in (not_deployable_reason(python_version) or "")


# --- retry with a corrected source --------------------------------------------------------


def test_retry_with_a_corrected_source(model, release, artifact_root):
    weights(artifact_root, "right")
    version = make_version(model, artifact_root, artifact_uri=f"file://{artifact_root}/right")
    version = failed(version)
    weights(artifact_root, "fixed")
    retried = retry_version(version, actor=ACTOR, artifact_uri=f"file://{artifact_root}/fixed")
    assert retried.state == VersionState.REGISTERED
    assert retried.artifact_uri == f"file://{artifact_root}/fixed"
    assert "→" in retried.events.last().message


def test_retry_checks_the_new_source_and_leaves_the_version_failed(model, release, artifact_root):
    weights(artifact_root, "right")
    version = failed(
        make_version(model, artifact_root, artifact_uri=f"file://{artifact_root}/right")
    )
    with pytest.raises(ValidationError, match="does not exist"):
        retry_version(version, actor=ACTOR, artifact_uri=f"file://{artifact_root}/still-wrong")
    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert version.artifact_uri.endswith("/right")


def test_retry_of_a_version_that_did_not_fail_is_a_conflict(model, release, artifact_root):
    weights(artifact_root, "right")
    version = make_version(model, artifact_root, artifact_uri=f"file://{artifact_root}/right")
    with pytest.raises(Conflict):
        retry_version(version, actor=ACTOR, artifact_uri=f"file://{artifact_root}/right")


def test_api_retry_with_a_new_source(api, member_token, model, release, artifact_root):
    weights(artifact_root, "right")
    version = failed(
        make_version(model, artifact_root, artifact_uri=f"file://{artifact_root}/right")
    )
    client = api(member_token)
    bad = client.post(
        f"/api/v1/versions/{version.pk}/retry/",
        {"artifact_uri": f"file://{artifact_root}/nope"},
        format="json",
    )
    assert (
        bad.status_code == 400 and "artifact_uri" in bad.json().get("errors", bad.json()).__str__()
    )
    weights(artifact_root, "fixed")
    good = client.post(
        f"/api/v1/versions/{version.pk}/retry/",
        {"artifact_uri": f"file://{artifact_root}/fixed"},
        format="json",
    )
    assert good.status_code == 200, good.content
    assert good.json()["state"] == "registered"
    assert good.json()["artifact_uri"] == f"file://{artifact_root}/fixed"
    again = client.post(f"/api/v1/versions/{version.pk}/retry/", {}, format="json")
    assert again.status_code == 409


def test_a_staging_area_of_another_source_is_not_resumed(settings, tmp_path):
    staging = content_store().staging("version-1")
    staging.keep_only_for("file:///a")
    staging.file("config.json").parent.mkdir(parents=True)
    staging.file("config.json").write_text("from a")
    staging.keep_only_for("file:///a")
    assert staging.file("config.json").exists()
    staging.keep_only_for("file:///b")
    assert not staging.file("config.json").exists()


def test_an_operator_sets_the_backends_in_the_admin(db):
    from django.contrib.auth import get_user_model
    from django.test import Client

    root = get_user_model().objects.create_superuser(username="root", password="pw-root")
    client = Client()
    client.force_login(root)
    fields = {
        "name": "gpu-llm",
        "description": "",
        "accelerator": "nvidia-h100",
        "gpus": 1,
        "cpus": 8,
        "memory_gib": 64,
        "node_selector": "{}",
        "tolerations": "[]",
        "engine": "auto",
        "is_active": "on",
    }
    refused = client.post("/admin/deployments/instancetype/add/", fields)
    assert refused.status_code == 200 and "This field is required" in refused.content.decode()
    added = client.post("/admin/deployments/instancetype/add/", {**fields, "backends": ["vllm"]})
    assert added.status_code == 302, added.content.decode()[:3000]
    assert InstanceType.objects.get(name="gpu-llm").backends == ["vllm"]
