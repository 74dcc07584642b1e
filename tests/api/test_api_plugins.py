"""Plugin wheels through the API: upload (multipart), list and detail, team scoping, and versions
naming them at registration, with each refusal under its field."""

from __future__ import annotations

import hashlib

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from portal.registry.models import ModelVersion, PluginWheel
from tests.api.helpers import api_error, nothing_created, ok
from tests.plugin_examples import example_wheels
from tests.plugin_wheels import make_wheel

pytestmark = pytest.mark.django_db

PLUGINS = "/api/v1/plugins/"
VERSIONS = "/api/v1/versions/"


def upload(client, path, **fields):
    wheel = SimpleUploadedFile(path.name, path.read_bytes(), "application/octet-stream")
    return client.post(PLUGINS, {"wheel": wheel, **fields}, format="multipart")


@pytest.fixture
def client(api, member_token):
    return api(member_token)


def test_upload_list_detail_and_the_same_bytes_again(client, team, release, settings):
    path = example_wheels()["no_repeat_window"]
    body = ok(upload(client, path), 201)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    wheel = PluginWheel.objects.get()
    assert body | {"created_at": None} == {
        "id": wheel.pk,
        "team": "search",
        "sha256": digest,
        "filename": "no_repeat_window-1.0.0-py3-none-any.whl",
        "name": "no-repeat-window",
        "version": "1.0.0",
        "size": path.stat().st_size,
        "general_plugins": {},
        "logits_processors": {"no_repeat_window": "no_repeat_window:NoRepeatWindow"},
        "requires": ["vllm==0.24.0"],
        "created_at": None,
    }
    stored = settings.MODEL_CACHE_ROOT / "plugins" / "sha256" / digest[:2] / f"{digest}.whl"
    assert stored.read_bytes() == path.read_bytes()
    assert [p.name for p in (settings.MODEL_CACHE_ROOT / "plugins" / "incoming").iterdir()] == []

    assert ok(upload(client, path, team="search"), 200) == body  # content-addressed: one row
    assert ok(client.get(PLUGINS))["results"] == [body]
    assert ok(client.get(f"{PLUGINS}{wheel.pk}/")) == body


def test_team_scoping(client, api, viewer, outsider, team, other_team, release):
    path = example_wheels()["tiny_bigram"]
    wheel_id = ok(upload(client, path), 201)["id"]
    # Another team's wheel does not exist for the outsider; they cannot upload into our team.
    api_error(api(outsider).get(f"{PLUGINS}{wheel_id}/"), 404, "not_found")
    assert ok(api(outsider).get(PLUGINS))["results"] == []
    error = api_error(upload(api(outsider), path, team="search"), 400, "invalid")
    assert "No team 'search'" in error["fields"]["team"][0]
    # A viewer reads but does not upload.
    assert ok(api(viewer).get(f"{PLUGINS}{wheel_id}/"))["id"] == wheel_id
    api_error(upload(api(viewer), path, team="search"), 403, "permission_denied")
    assert PluginWheel.objects.count() == 1


@pytest.mark.parametrize(
    "kind, needle",
    [
        ("sdist", "only wheels"),
        ("old_vllm", "requires vllm==0.11, the release triton-26.07 pins vllm 0.24.0"),
        ("no_entry_points", "declares no entry point"),
        ("too_big", "over the limit of 300 bytes"),
    ],
)
def test_refused_uploads_say_why(client, team, release, tmp_path, settings, kind, needle):
    if kind == "sdist":
        path = tmp_path / "plugin-1.0.0.tar.gz"
        path.write_bytes(b"an sdist")
    elif kind == "old_vllm":
        path = make_wheel(tmp_path, "old", requires=["vllm==0.11"],
                          entry_points={"vllm.general_plugins": {"old": "old:register"}})  # fmt: skip
    elif kind == "no_entry_points":
        path = make_wheel(tmp_path, "inert")
    else:
        settings.PLUGIN_WHEEL_MAX_BYTES = 300
        path = example_wheels()["tiny_bigram"]
    error = api_error(upload(client, path), 400, "invalid")
    assert needle in " ".join(error["fields"]["wheel"]), error
    assert PluginWheel.objects.count() == 0
    assert list((settings.MODEL_CACHE_ROOT / "plugins" / "incoming").iterdir()) == []


def test_upload_needs_a_wheel_field(client, team):
    error = api_error(client.post(PLUGINS, {"team": "search"}, format="multipart"), 400, "invalid")
    assert "wheel" in error["fields"]


def test_register_a_version_naming_plugins(client, model, release, artifact_root):
    wheels = example_wheels()
    window = ok(upload(client, wheels["no_repeat_window"]), 201)
    bigram = ok(upload(client, wheels["tiny_bigram"]), 201)
    body = {"model": model.pk, "artifact_uri": f"file://{artifact_root}/ranker",
            "plugins": [window["sha256"], bigram["id"]]}  # fmt: skip
    created = ok(client.post(VERSIONS, body, format="json"), 201)
    assert created["plugins"] == [
        {
            "name": "no-repeat-window", "version": "1.0.0", "filename": window["filename"],
            "sha256": window["sha256"], "size": window["size"], "origin": "uploaded",
            "general_plugins": {},
            "logits_processors": {"no_repeat_window": "no_repeat_window:NoRepeatWindow"},
        },
        {
            "name": "tiny-bigram", "version": "1.0.0", "filename": bigram["filename"],
            "sha256": bigram["sha256"], "size": bigram["size"], "origin": "uploaded",
            "general_plugins": {"tiny_bigram": "tiny_bigram:register"},
            "logits_processors": {},
        },
    ]  # fmt: skip
    version = ModelVersion.objects.get(pk=created["id"])
    assert {w.pk for w in version.plugins.all()} == {window["id"], bigram["id"]}
    assert ok(client.get(f"{VERSIONS}{version.pk}/"))["plugins"] == created["plugins"]


def test_version_plugins_refused_by_field(client, api, model, release, artifact_root, outsider,
                                          tmp_path):  # fmt: skip
    foreign = ok(upload(api(outsider), example_wheels()["tiny_bigram"], team="ads"), 201)
    base = {"model": model.pk, "artifact_uri": f"file://{artifact_root}/ranker"}
    cases = [
        ([foreign["sha256"]], "plugins", "No plugin wheel"),  # another team's: unknown here
        ([foreign["id"]], "plugins", "No plugin wheel"),
        (["f" * 64], "plugins", "No plugin wheel"),
        (["not-a-digest"], "plugins", "neither a plugin wheel's sha256 nor its id"),
        ([1.5], "plugins.0", "sha256 (64 hex digits) or its id"),
        ("abc", "plugins", "Expected a list"),
    ]
    for plugins, field, needle in cases:
        with nothing_created():
            response = client.post(VERSIONS, {**base, "plugins": plugins}, format="json")
        error = api_error(response, 400, "invalid")
        assert needle in " ".join(error["fields"][field]), (plugins, error)
    # Same entry point name in two wheels of one version.
    ids = []
    for name in ("one", "two"):
        path = make_wheel(tmp_path / name, name,
                          entry_points={"vllm.logits_processors": {"same": f"{name}:P"}})  # fmt: skip
        ids.append(ok(upload(client, path), 201)["id"])
    with nothing_created():
        response = client.post(VERSIONS, {**base, "plugins": ids}, format="json")
    error = api_error(response, 400, "invalid")
    assert "both declare the entry point 'same'" in error["fields"]["plugins"][0]
