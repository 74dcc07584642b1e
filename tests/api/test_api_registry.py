"""Models and versions through the API: creating, changing, and every way input is refused.

Each refused call is checked for its error body and for leaving no row behind.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.cache.models import Materialization
from portal.registry.lifecycle import transition_version
from portal.registry.models import Model, ModelVersion, PlatformRelease, VersionState
from tests.api.helpers import api_error, nothing_created
from tests.factories import make_version

pytestmark = pytest.mark.django_db

MODELS = "/api/v1/models/"
VERSIONS = "/api/v1/versions/"


def refused(client, method: str, url: str, body, field: str, *needles: str) -> list[str]:
    """Make a call that must fail validation on ``field`` and create nothing; return messages."""
    with nothing_created():
        response = getattr(client, method)(url, body, format="json")
    error = api_error(response, 400, "invalid")
    assert field in error["fields"], error
    text = " ".join(error["fields"][field])
    for needle in needles:
        assert needle in text, text
    return error["fields"][field]


@pytest.fixture
def client(api, member_token):
    return api(member_token)


IO_SPEC = {
    "inputs": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
    "outputs": [{"name": "score", "data_type": "TYPE_FP32", "dims": [-1]}],
}


# --- Models -----------------------------------------------------------------------------------


def test_model_create_list_retrieve_patch(client, team):
    response = client.post(
        MODELS, {"slug": "ranker", "task": "ranking", "description": "Reranks."}, format="json"
    )
    assert response.status_code == 201, response.content
    created = response.json()
    model = Model.objects.get(pk=created["id"])
    assert (model.team, model.slug, model.task) == (team, "ranker", "ranking")
    assert created | {"created_at": None} == {
        "id": model.pk,
        "team": "search",
        "slug": "ranker",
        "task": "ranking",
        "description": "Reranks.",
        "latest_version": None,
        "created_at": None,
    }

    assert [m["slug"] for m in client.get(MODELS).json()["results"]] == ["ranker"]
    assert client.get(f"{MODELS}{model.pk}/").json() == created

    response = client.patch(f"{MODELS}{model.pk}/", {"description": "Better."}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["description"] == "Better."
    model.refresh_from_db()
    assert model.description == "Better."


def test_model_without_team_uses_the_callers_only_team(api, member):
    response = api(member).post(MODELS, {"slug": "ranker", "task": "chat"}, format="json")
    assert response.status_code == 201, response.content
    assert Model.objects.get(slug="ranker").created_by == member


def test_latest_version_counts_registered_versions(client, model, release, artifact_root):
    make_version(model, artifact_root)
    make_version(model, artifact_root)
    assert client.get(f"{MODELS}{model.pk}/").json()["latest_version"] == 2


def test_malformed_json_is_refused(client):
    with nothing_created():
        response = client.post(MODELS, '{"slug": "ranker", ', content_type="application/json")
    error = api_error(response, 400, "malformed_request")
    assert "JSON parse error" in error["message"]
    assert "fields" not in error


def test_deeply_nested_json_is_a_400_not_a_recursion_error(client):
    body = '{"slug": "ranker", "task": "chat", "description": ' + "[" * 3000 + "]" * 3000 + "}"
    with nothing_created():
        response = client.post(MODELS, body, content_type="application/json")
    error = api_error(response, 400, "malformed_request")
    assert "deeper than 64 levels" in error["message"]
    # Brackets inside strings are text, not nesting.
    response = client.post(
        MODELS, {"slug": "ranker", "task": "chat", "description": "[" * 3000}, format="json"
    )
    assert response.status_code == 201, response.content


def test_oversized_json_is_a_413_before_it_is_read(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = '{"slug": "ranker", "task": "chat", "description": "' + "d" * 1000 + '"}'
    with nothing_created():
        response = client.post(MODELS, body, content_type="application/json")
    error = api_error(response, 413, "request_too_large")
    assert "1000 bytes" in error["message"]


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ([{"slug": "ranker"}], "non_field_errors", "Expected a dictionary"),
        ({"slug": "ranker", "task": "poem"}, "task", '"poem" is not a valid choice.'),
        ({"slug": ["ranker"], "task": "chat"}, "slug", 'Enter a valid "slug"'),
        ({"slug": "ranker", "task": "chat", "description": {"a": 1}}, "description", "Not a valid string."),
        ({"slug": "Not a slug!", "task": "chat"}, "slug", 'Enter a valid "slug"'),
        ({"slug": "ranker"}, "task", "This field is required."),
        ({"slug": "ranker", "task": "chat", "colour": "red"}, "colour", "Unknown field."),
        ({"slug": "r" * 64, "task": "chat"}, "slug", "no more than 63 characters"),
        ({"slug": "ranker", "task": "chat", "description": "d" * 5001}, "description", "no more than 5000 characters"),
        ({"slug": "ranker", "task": "chat", "team": "nope"}, "team", "No team 'nope'."),
    ],
    ids=["list-body", "bad-choice", "wrong-type", "wrong-type-2", "bad-slug", "missing", "unknown-field",
         "long-slug", "long-description", "unknown-team"],
)  # fmt: skip
def test_model_create_validation(client, team, body, field, needle):
    refused(client, "post", MODELS, body, field, needle)


def test_longest_allowed_values_are_accepted(client, team):
    body = {"slug": "r" * 63, "task": "chat", "description": "d" * 5000}
    assert client.post(MODELS, body, format="json").status_code == 201


def test_duplicate_slug_in_a_team_names_the_slug(client, model, api, outsider):
    messages = refused(client, "post", MODELS, {"slug": "ranker", "task": "chat"}, "slug")
    assert messages == ["Team search already has a model 'ranker'."]
    # Another team may use the same slug.
    response = api(outsider).post(MODELS, {"slug": "ranker", "task": "chat"}, format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"description": "d" * 5001}, "description", "no more than 5000 characters"),
        ({"description": True}, "description", "Not a valid string."),
        ({"slug": "renamed"}, "slug", "Unknown field."),
        ({"task": "chat"}, "task", "Unknown field."),
    ],
)
def test_model_patch_validation(client, model, body, field, needle):
    refused(client, "patch", f"{MODELS}{model.pk}/", body, field, needle)
    model.refresh_from_db()
    assert (model.slug, model.task, model.description) == ("ranker", "chat", "")


# --- Versions ---------------------------------------------------------------------------------


def version_body(model, artifact_root, **overrides) -> dict:
    return {"model": model.pk, "artifact_uri": f"file://{artifact_root}/ranker", **overrides}


def test_version_create_list_retrieve_patch(client, model, release, artifact_root, member):
    body = version_body(
        model, artifact_root, engine_args={"dtype": "bfloat16", "max_model_len": 4096}
    )
    response = client.post(VERSIONS, body, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    version = ModelVersion.objects.get(pk=created["id"])
    assert version.created_by == member  # the token's creator
    assert {
        k: created[k] for k in ("model", "model_slug", "team", "number", "state", "backend")
    } == {
        "model": model.pk,
        "model_slug": "ranker",
        "team": "search",
        "number": 1,
        "state": "registered",
        "backend": "vllm",
    }
    assert created["api_surface"] == "openai+grpc"
    assert created["tool_call_parser"] == "hermes"  # the default
    assert created["release"]["name"] == release.name
    assert created["engine_args"] == {"dtype": "bfloat16", "max_model_len": 4096}

    second = client.post(VERSIONS, body, format="json").json()
    assert second["number"] == 2
    assert [v["number"] for v in client.get(VERSIONS).json()["results"]] == [2, 1]
    assert client.get(f"{VERSIONS}{version.pk}/").json() == created

    response = client.patch(
        f"{VERSIONS}{version.pk}/",
        {"engine_args": {"dtype": "half"}, "artifact_uri": "hf://org/name@main"},
        format="json",
    )
    assert response.status_code == 200, response.content
    version.refresh_from_db()
    assert (version.engine_args, version.artifact_uri) == ({"dtype": "half"}, "hf://org/name@main")
    assert response.json()["engine_args"] == {"dtype": "half"}


def test_python_backend_version(client, model, release, artifact_root):
    body = version_body(model, artifact_root, backend="python", io_spec=IO_SPEC, api_surface="grpc")
    response = client.post(VERSIONS, body, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["backend"], response.json()["io_spec"]) == ("python", IO_SPEC)


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("http://example.com/weights", "Scheme 'http' is not allowed"),
        ("https://huggingface.co/org/name", "Scheme 'https' is not allowed"),
        ("/plain/path", "Scheme '(none)' is not allowed"),
        ("s3://Bad_Bucket/weights", "'Bad_Bucket' is not a valid S3 bucket name."),
        ("s3://bucket//weights", "empty segments"),
        ("s3://key:secret@bucket/weights", "credentials"),
        ("hf://org", "Hugging Face sources look like"),
        ("hf://-org/name", "Hugging Face sources look like"),
        ("hf://org/name@-rev", "'-rev' is not a valid revision."),
        ("file:///etc/passwd", "/etc/passwd is outside the allowed artifact roots"),
        ("file://remote-host{root}/w", "must be local"),
        ("file://{root}/../escape", "'..' path segments"),
        ("file://{root}/%2e%2e/escape", "'..' path segments"),
        ("file://{root}/%2E%2E/escape", "'..' path segments"),
        ("file://{root}/%252e%252e/escape", "'..' path segments"),
        ("file://{root}/w?x=1", "query string"),
        ("file://{root}/a b", "whitespace"),
        ("file://{root}/" + "w" * 1024, "no more than 1024 characters"),
    ],
)
def test_bad_artifact_uris(client, model, release, artifact_root, uri, needle):
    body = version_body(model, artifact_root, artifact_uri=uri.format(root=artifact_root))
    refused(client, "post", VERSIONS, body, "artifact_uri", needle)


@pytest.mark.parametrize(
    ("engine_args", "needles"),
    [
        (
            {"speculative_model": "x"},
            ["Unknown or not allowed engine argument(s): speculative_model."],
        ),
        ({"dtype": "auto", "foo": 1, "bar": 2}, ["not allowed engine argument(s): bar, foo."]),
        ({"model": "/elsewhere"}, ["model: set by the platform"]),
        ({"max_model_len": "long"}, ["max_model_len: must be int, got str."]),
        ({"enforce_eager": 1}, ["enforce_eager: must be bool, got int."]),
        ({"gpu_memory_utilization": 1.5}, ["gpu_memory_utilization: must be in (0, 1]"]),
        ({"dtype": "int3"}, ["dtype: must be one of"]),
        # vLLM 0.24.0's AsyncEngineArgs has no swap_space: Triton's backend would not load it.
        ({"swap_space": 4}, ["swap_space: removed from vLLM", "AsyncEngineArgs has no such field"]),
        ({"kv_cache_dtype": "fp4"}, ["kv_cache_dtype: must be one of"]),
        ({"quantization": "no-such-method"}, ["quantization: must be one of"]),
        ([["dtype", "auto"]], ["Must be a JSON object"]),
    ],
)
def test_forbidden_engine_args(client, model, release, artifact_root, engine_args, needles):
    body = version_body(model, artifact_root, engine_args=engine_args)
    refused(client, "post", VERSIONS, body, "engine_args", *needles)


def test_engine_args_refused_on_patch_leave_the_version_unchanged(client, version):
    refused(
        client,
        "patch",
        f"{VERSIONS}{version.pk}/",
        {"engine_args": {"nope": 1}},
        "engine_args",
        "nope",
    )
    version.refresh_from_db()
    assert version.engine_args == {"dtype": "auto"}


#: (body fragment, field the error is reported under, path named in the message).
OVERRIDES = [
    ({"engine_args": {"vllm_version": "0.9.0"}}, "engine_args", "engine_args.vllm_version"),
    ({"vllm_version": "0.9.0"}, "vllm_version", "vllm_version"),
    ({"engine_args": {"x": {"pip_requirements": ["vllm"]}}}, "engine_args", "engine_args.x.pip_requirements"),
    ({"engine_args": {"revision": "vllm==0.9.0"}}, "engine_args", "engine_args.revision"),
    ({"engine_args": {"extra": ["--x", "pip install vllm"]}}, "engine_args", "engine_args.extra[1]"),
    ({"triton_image": "nvcr.io/nvidia/tritonserver:24.01-vllm-python-py3"}, "triton_image", "triton_image"),
    ({"io_spec": {**IO_SPEC, "requirements": ["vllm"]}}, "io_spec", "io_spec.requirements"),
    ({"constraint_plugins": ["vllm>=0.9"]}, "constraint_plugins", "constraint_plugins[0]"),
]  # fmt: skip


@pytest.mark.parametrize("method", ["post", "patch"])
@pytest.mark.parametrize(("fragment", "field", "path"), OVERRIDES)
def test_version_overrides_are_refused_as_pinned(
    client, model, version, artifact_root, method, fragment, field, path
):
    if method == "post":
        url, body = VERSIONS, version_body(model, artifact_root, **fragment)
    else:
        url, body = f"{VERSIONS}{version.pk}/", fragment
    [message] = refused(client, method, url, body, field, path, "pinned", "vLLM 0.24.0")
    assert message.startswith(f"{path}: ")
    version.refresh_from_db()
    assert version.engine_args == {"dtype": "auto"}


def test_version_tool_call_format(client, model, release, artifact_root):
    body = version_body(model, artifact_root, tool_call_parser="llama3_json")
    response = client.post(VERSIONS, body, format="json")
    assert response.status_code == 201, response.content
    assert ModelVersion.objects.get(pk=response.json()["id"]).tool_call_parser == "llama3_json"
    body = version_body(model, artifact_root, tool_call_parser="pythonic")
    refused(client, "post", VERSIONS, body, "tool_call_parser", "not a valid choice")


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"api_surface": "grpc"}, "io_spec", "The Python backend needs inputs and outputs."),
        ({"api_surface": "grpc", "io_spec": {"inputs": IO_SPEC["inputs"]}}, "io_spec", "outputs: must be a non-empty list"),
        (
            {"api_surface": "grpc", "io_spec": {**IO_SPEC, "inputs": [{"name": "1x", "data_type": "TYPE_NOPE", "dims": [0]}]}},
            "io_spec",
            "'TYPE_NOPE' is not a Triton data type",
        ),
        ({"api_surface": "grpc", "io_spec": {**IO_SPEC, "extra": 1}}, "io_spec", "Unknown key(s): extra."),
        ({"io_spec": IO_SPEC, "api_surface": "openai+grpc"}, "api_surface", "(choose 'grpc')"),
        ({"io_spec": IO_SPEC, "api_surface": "grpc", "engine_args": {"dtype": "auto"}}, "engine_args", "vLLM backend only"),
    ],
    ids=["no-io-spec", "no-outputs", "bad-tensor", "unknown-key", "openai-surface", "engine-args"],
)  # fmt: skip
def test_python_backend_validation(client, model, release, artifact_root, overrides, field, needle):
    body = version_body(model, artifact_root, backend="python", **overrides)
    refused(client, "post", VERSIONS, body, field, needle)


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"model": "ranker"}, "model", "A valid integer is required."),
        ({"model": 999999}, "model", "No model with id 999999."),
        ({"backend": "tensorrt"}, "backend", '"tensorrt" is not a valid choice.'),
        ({"api_surface": "rest"}, "api_surface", '"rest" is not a valid choice.'),
        ({"io_spec": IO_SPEC}, "io_spec", "Leave io_spec empty for the vLLM backend"),
        ({"constraint_plugins": "platform-constraints"}, "constraint_plugins", "Expected a list"),
        ({"constraint_plugins": ["nope"]}, "constraint_plugins", "Unknown plugin 'nope'"),
        ({"constraint_plugins": ["platform-constraints"] * 2}, "constraint_plugins", "listed once"),
        ({"artifact_uri": None}, "artifact_uri", "may not be null"),
        ({"number": 7}, "number", "Unknown field."),
        ({"state": "ready"}, "state", "Unknown field."),
    ],
)
def test_version_create_validation(client, model, release, artifact_root, overrides, field, needle):
    body = {**version_body(model, artifact_root), **overrides}
    refused(client, "post", VERSIONS, body, field, needle)


def test_valid_constraint_plugin_is_accepted(client, model, release, artifact_root):
    body = version_body(model, artifact_root, constraint_plugins=["platform-constraints"])
    response = client.post(VERSIONS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["constraint_plugins"] == ["platform-constraints"]


def test_version_without_a_default_release_conflicts(client, model, artifact_root):
    PlatformRelease.objects.update(is_default=False)
    with nothing_created():
        response = client.post(VERSIONS, version_body(model, artifact_root), format="json")
    assert "default platform release" in api_error(response, 409, "no_default_release")["message"]


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"artifact_uri": "http://example.com/w"}, "artifact_uri", "Scheme 'http' is not allowed"),
        ({"artifact_uri": "x" * 1025}, "artifact_uri", "no more than 1024 characters"),
        ({"backend": "python"}, "backend", "Unknown field."),
        ({"model": 5}, "model", "Unknown field."),
        ({"io_spec": IO_SPEC}, "io_spec", "Leave io_spec empty"),
        ({"engine_args": "dtype=auto"}, "engine_args", "Must be a JSON object"),
    ],
)
def test_version_patch_validation(client, version, body, field, needle):
    before = ModelVersion.objects.values().get(pk=version.pk)
    refused(client, "patch", f"{VERSIONS}{version.pk}/", body, field, needle)
    assert ModelVersion.objects.values().get(pk=version.pk) == before


READY_PATH = [
    VersionState.MATERIALIZING,
    VersionState.MATERIALIZED,
    VersionState.PACKAGING,
    VersionState.READY,
]


@pytest.mark.parametrize("state", READY_PATH)
def test_versions_past_registered_are_immutable(client, version, state):
    for step in READY_PATH[: READY_PATH.index(state) + 1]:
        transition_version(version, step)
    before = ModelVersion.objects.values().get(pk=version.pk)
    response = client.patch(
        f"{VERSIONS}{version.pk}/", {"engine_args": {"dtype": "half"}}, format="json"
    )
    error = api_error(response, 409, "immutable_version")
    assert f"Version 1 is {state}" in error["message"]
    assert "register a new version" in error["message"]
    assert ModelVersion.objects.values().get(pk=version.pk) == before


def test_failed_version_can_be_fixed(client, version):
    transition_version(version, VersionState.FAILED, reason="weights missing")
    response = client.patch(
        f"{VERSIONS}{version.pk}/", {"artifact_uri": "s3://models-bucket/ranker"}, format="json"
    )
    assert response.status_code == 200, response.content
    version.refresh_from_db()
    assert version.artifact_uri == "s3://models-bucket/ranker"


def test_repository_named_like_vllm_is_not_taken_for_a_version_pin(client, model, release):
    body = {"model": model.pk, "artifact_uri": "hf://RedHatAI/Llama-3-8B-vllm@main"}
    response = client.post(VERSIONS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["artifact_uri"] == "hf://RedHatAI/Llama-3-8B-vllm@main"


def test_python_backend_model_py_upload(client, model, release):
    body = {
        "model": model.pk,
        "artifact_uri": "s3://models-bucket/scorer",
        "backend": "python",
        "api_surface": "grpc",
        "io_spec": {
            "inputs": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
            "outputs": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}],
        },
        # Code may mention pip freely: it is checked as code, not scanned for version pins.
        "python_model": "# pip install nothing\nclass TritonPythonModel:\n    def execute(self, r):\n        return r\n",
    }
    response = client.post(VERSIONS, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["python_model"] == body["python_model"]

    with nothing_created():
        bad = client.post(
            VERSIONS,
            {**body, "python_model": "class TritonPythonModel:\n    pass\n"},
            format="json",
        )
    error = api_error(bad, 400, "invalid")
    assert "must define execute" in error["fields"]["python_model"][0]


def test_version_events_endpoint(client, version, api, outsider):
    from portal.registry.lifecycle import transition_version

    transition_version(version, "materializing", reason="copying 2 files")
    response = client.get(f"{VERSIONS}{version.pk}/events/")
    assert response.status_code == 200
    assert [(e["from_state"], e["to_state"], e["message"]) for e in response.json()] == [
        ("registered", "materializing", "copying 2 files")
    ]
    assert api(outsider).get(f"{VERSIONS}{version.pk}/events/").status_code == 404


def test_version_shows_materialization_progress(client, version, api, outsider):
    assert client.get(f"{VERSIONS}{version.pk}/").json()["materialization"] is None
    started = timezone.now() - timedelta(seconds=10)
    Materialization.objects.create(
        version=version, tree="models/x", state="copying", bytes_total=1000, bytes_done=250,
        bytes_fetched=200, files_total=4, files_done=1, started_at=started,
        heartbeat_at=started + timedelta(seconds=4),
    )  # fmt: skip
    body = client.get(f"{VERSIONS}{version.pk}/").json()["materialization"]
    assert {k: body[k] for k in ("state", "bytes_done", "bytes_total", "files_done")} == {
        "state": "copying", "bytes_done": 250, "bytes_total": 1000, "files_done": 1,
    }  # fmt: skip
    assert body["rate_bytes_per_second"] == 50.0  # 200 bytes fetched in 4 s
    assert body["eta_seconds"] == 15.0  # 750 bytes to go
    assert api(outsider).get(f"{VERSIONS}{version.pk}/").status_code == 404


def test_retry_sends_a_failed_version_back_to_the_copy(client, version, viewer_token, api):
    error = api_error(client.post(f"{VERSIONS}{version.pk}/retry/"), 409, "not_failed")
    assert "only failed versions are retried" in error["message"]

    transition_version(version, VersionState.FAILED, reason="Access denied to s3://b/m")
    assert api(viewer_token).post(f"{VERSIONS}{version.pk}/retry/").status_code == 403
    response = client.post(f"{VERSIONS}{version.pk}/retry/")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "registered"
    assert response.json()["failure_reason"] == ""
