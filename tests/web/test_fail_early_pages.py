"""Failing early on the pages: the version form reports every field's errors at once and keeps
an uploaded model.py, the Python backend is served KServe-only, deploy links appear only on
ready versions, the deploy form never swaps the version it was asked for and offers only the
instance types that can serve it, and a failed version is retried from a corrected source."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from portal.deployments.models import InstanceType
from portal.registry.lifecycle import transition_version
from portal.registry.models import ApiSurface, ModelVersion, VersionState
from tests.factories import TAGGER_IO, make_python_version, make_version

pytestmark = pytest.mark.django_db

MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


@pytest.fixture(autouse=True)
def _check_sources(settings):
    settings.ARTIFACT_FILE_CHECK_ON_REGISTER = True


@pytest.fixture
def client(member) -> Client:
    client = Client()
    client.force_login(member)
    return client


def weights(root, name: str):
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.json").write_text("{}")
    return f"file://{root}/{name}"


def ready(version: ModelVersion) -> ModelVersion:
    for state in (
        VersionState.MATERIALIZING,
        VersionState.MATERIALIZED,
        VersionState.PACKAGING,
        VersionState.READY,
    ):
        transition_version(version, state, reason="test")
    return version


def failed(version: ModelVersion, reason: str = "the source was wrong") -> ModelVersion:
    return transition_version(version, VersionState.FAILED, reason=reason)


def field_errors(page: str, field: str) -> bool:
    return f'id="id_{field}_errors"' in page


# --- the version form -----------------------------------------------------------------------


def test_broken_json_does_not_hide_the_other_fields_errors(client, team, model, release):
    page = client.post(
        reverse("web:version_new", args=[team.slug, model.slug]),
        {
            "artifact_uri": "file:///nowhere/at/all",
            "backend": "vllm",
            "api_surface": ApiSurface.OPENAI_GRPC,
            "engine_args": "{broken",
            "constraint_plugins": ["no-such-plugin"],
        },
    ).content.decode()
    assert "Not valid JSON" in page
    assert field_errors(page, "engine_args")
    assert field_errors(page, "artifact_uri") and "outside the allowed artifact roots" in page
    assert field_errors(page, "constraint_plugins")
    assert not model.versions.exists()


def test_a_missing_source_is_a_field_error(client, team, model, release, artifact_root):
    page = client.post(
        reverse("web:version_new", args=[team.slug, model.slug]),
        {"artifact_uri": f"file://{artifact_root}/typo", "backend": "vllm"},
    ).content.decode()
    assert field_errors(page, "artifact_uri")
    assert f"{artifact_root}/typo does not exist." in page


def test_the_uploaded_model_py_is_kept_across_an_error_and_used(
    client, team, model, release, artifact_root
):
    url = reverse("web:version_new", args=[team.slug, model.slug])
    first = client.post(
        url,
        {
            "artifact_uri": weights(artifact_root, "tagger"),
            "backend": "python",
            "io_spec": "{not json",
            "python_model": SimpleUploadedFile("tagger.py", MODEL_PY.encode()),
        },
    ).content.decode()
    assert field_errors(first, "io_spec")
    assert 'data-testid="model-py-kept"' in first and "tagger.py" in first
    assert 'name="kept_model_py"' in first
    # The browser sends the kept content back (as CRLF, as forms do); no file this time.
    second = client.post(
        url,
        {
            "artifact_uri": weights(artifact_root, "tagger"),
            "backend": "python",
            "io_spec": '{"inputs": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],'
            ' "outputs": [{"name": "TAGS", "data_type": "TYPE_STRING", "dims": [-1]}]}',
            "kept_model_py": MODEL_PY.replace("\n", "\r\n"),
            "kept_model_py_name": "tagger.py",
        },
    )
    assert second.status_code == 302, second.context["form"].errors
    version = model.versions.get()
    assert version.python_model == MODEL_PY
    assert version.api_surface == ApiSurface.GRPC  # the Python backend's one surface


def test_the_python_form_is_served_kserve_only_even_if_openai_was_left_checked(
    client, team, model, release, artifact_root
):
    response = client.post(
        reverse("web:version_new", args=[team.slug, model.slug]),
        {
            "artifact_uri": weights(artifact_root, "tagger"),
            "backend": "python",
            "api_surface": ApiSurface.OPENAI_GRPC,  # hidden with the vLLM fields
            "io_spec": '{"inputs": [{"name": "T", "data_type": "TYPE_FP32", "dims": [1]}],'
            ' "outputs": [{"name": "O", "data_type": "TYPE_FP32", "dims": [1]}]}',
            "python_model": SimpleUploadedFile("model.py", MODEL_PY.encode()),
        },
    )
    assert response.status_code == 302
    assert model.versions.get().api_surface == ApiSurface.GRPC
    page = client.get(reverse("web:version_new", args=[team.slug, model.slug])).content.decode()
    assert 'data-testid="python-surface"' in page


# --- deploy links and the deploy form -------------------------------------------------------


def test_deploy_links_only_on_ready_versions(client, team, model, release, artifact_root):
    copying = make_version(model, artifact_root, artifact_uri=weights(artifact_root, "a"))
    bad = failed(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "b")))
    model_page = client.get(reverse("web:model_detail", args=[team.slug, model.slug]))
    text = model_page.content.decode()
    assert "Deploy v" not in text and "/deploy/" not in text
    for version in (copying, bad):
        page = client.get(
            reverse("web:version_detail", args=[team.slug, model.slug, version.number])
        ).content.decode()
        assert f"Deploy v{version.number}" not in page
    assert (
        "not ready yet"
        in client.get(
            reverse("web:version_detail", args=[team.slug, model.slug, copying.number])
        ).content.decode()
    )
    good = ready(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "c")))
    page = client.get(
        reverse("web:version_detail", args=[team.slug, model.slug, good.number])
    ).content.decode()
    assert f"Deploy v{good.number}" in page
    text = client.get(reverse("web:model_detail", args=[team.slug, model.slug])).content.decode()
    assert f'data-testid="deploy-v{good.number}"' in text
    assert f'data-testid="deploy-v{bad.number}"' not in text


def test_the_deploy_form_explains_instead_of_picking_another_version(
    client, team, model, release, artifact_root
):
    good = ready(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "a")))
    bad = failed(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "b")))
    url = reverse("web:deploy", args=[team.slug, model.slug])
    page = client.get(f"{url}?version={bad.number}").content.decode()
    assert f"v{bad.number} failed (the source was wrong)" in page
    assert f'value="{good.pk}" selected' not in page  # nothing chosen for them
    assert "Choose a version" in page
    page = client.get(f"{url}?version={good.number}").content.decode()
    assert f'value="{good.pk}" selected' in page
    assert 'data-testid="not-deployable"' not in page
    page = client.get(f"{url}?version=99").content.decode()
    assert "has no version 99" in page


def test_the_deploy_form_offers_and_accepts_only_types_that_can_serve_it(
    client, team, model, release, artifact_root, cpu_instance_type
):
    InstanceType.objects.create(name="gpu-llm", gpus=1, backends=["vllm"])
    weights(artifact_root, model.slug)
    version = ready(make_python_version(model, artifact_root, TAGGER_IO))
    url = reverse("web:deploy", args=[team.slug, model.slug])
    page = client.get(f"{url}?version={version.number}").content.decode()
    assert "cpu-local" in page and "gpu-llm" not in page
    assert "cannot serve this version&#x27;s backend are not listed" in page
    # A type the page did not offer (another version's page, a stale tab) is refused on it.
    llm = ready(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "llm")))
    gpu = InstanceType.objects.get(name="gpu-llm")
    assert gpu.cannot_run(llm.backend) is None
    response = client.post(
        url,
        {
            "version": version.pk,
            "strategy": "versioned",
            "replicas": 1,
            "instance_type": gpu.pk,
            "stages": "10, 50, 100",
            "bake_seconds": 60,
            "health_deadline_seconds": 300,
            "max_error_rate": 0.05,
        },
    )
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "instance_type")
    assert not model.deployments.exists()


# --- retry with a corrected source ----------------------------------------------------------


def test_retry_from_the_page_with_a_corrected_source(client, team, model, release, artifact_root):
    version = failed(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "a")))
    detail = reverse("web:version_detail", args=[team.slug, model.slug, version.number])
    page = client.get(detail).content.decode()
    assert 'data-testid="retry-form"' in page and f'value="file://{artifact_root}/a"' in page
    retry = reverse("web:version_retry", args=[team.slug, model.slug, version.number])
    refused = client.post(retry, {"artifact_uri": f"file://{artifact_root}/typo"}, follow=True)
    assert "does not exist" in refused.content.decode()
    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    client.post(retry, {"artifact_uri": weights(artifact_root, "fixed")})
    version.refresh_from_db()
    assert version.state == VersionState.REGISTERED
    assert version.artifact_uri == f"file://{artifact_root}/fixed"


def test_a_version_still_copying_is_kept_and_the_wait_said(
    client, team, model, release, artifact_root
):
    ready(make_version(model, artifact_root, artifact_uri=weights(artifact_root, "a")))
    copying = make_version(model, artifact_root, artifact_uri=weights(artifact_root, "b"))
    url = reverse("web:deploy", args=[team.slug, model.slug])
    page = client.get(f"{url}?version={copying.number}").content.decode()
    assert f'value="{copying.pk}" selected' in page
    assert 'data-testid="waits-for"' in page and "not ready yet" in page
