"""Plugin wheels in model packages: at ``<model>/plugins/<wheel>``, listed in the manifest's
``plugins`` (the contract the instance's start-up reads) and named in model.json, whether
uploaded or shipped under ``plugins/`` in the artifact; a refused artifact wheel fails the
version. Also what the version page shows of them."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile

import pytest
from django.test import Client
from django.urls import reverse

from portal.registry.lifecycle import transition_version
from portal.registry.models import ModelVersion, VersionState
from portal.registry.packaging import package_version, weights_dir
from portal.registry.services import upload_plugin_wheel
from serving.constraints import LOGITS_PROCESSOR
from serving.package import MANIFEST_NAME, extract_package
from tests.factories import make_version
from tests.plugin_examples import example_wheels
from tests.plugin_wheels import make_wheel

pytestmark = pytest.mark.django_db


def materialized(version: ModelVersion) -> ModelVersion:
    transition_version(version, VersionState.MATERIALIZING)
    return transition_version(version, VersionState.MATERIALIZED)


def read_archive(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def uploaded(team, name: str):
    path = example_wheels()[name]
    return upload_plugin_wheel(team=team, chunks=[path.read_bytes()], filename=path.name)[0]


def entry(name: str) -> dict:
    """The manifest entry the contract promises for an example wheel."""
    path = example_wheels()[name]
    window = name == "no_repeat_window"
    return {
        "file": f"search--ranker/plugins/{path.name}",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "size": path.stat().st_size,
        "name": "no-repeat-window" if window else "tiny-bigram",
        "version": "1.0.0",
        "general_plugins": {} if window else {"tiny_bigram": "tiny_bigram:register"},
        "logits_processors": (
            {"no_repeat_window": "no_repeat_window:NoRepeatWindow"} if window else {}
        ),
    }


def test_uploaded_plugins_in_the_package(team, model, release, artifact_root, tmp_path):
    wheels = [uploaded(team, "tiny_bigram"), uploaded(team, "no_repeat_window")]
    version = materialized(make_version(model, artifact_root, plugins=[w.pk for w in wheels]))
    version = package_version(version)
    assert version.state == VersionState.READY, version.failure_reason

    manifest = version.package_manifest
    assert manifest["plugins"] == [entry("no_repeat_window"), entry("tiny_bigram")]
    archive = tmp_path / "model-cache" / "packages" / f"{version.package_digest}.tar"
    files = read_archive(archive)
    listed = {f["path"]: f for f in manifest["files"]}
    for plugin in manifest["plugins"]:
        data = files[plugin["file"]]
        assert (
            hashlib.sha256(data).hexdigest() == plugin["sha256"] == listed[plugin["file"]]["sha256"]
        )
        assert len(data) == plugin["size"] == listed[plugin["file"]]["size"]
    model_json = json.loads(files["search--ranker/1/model.json"])
    assert model_json["logits_processors"] == [LOGITS_PROCESSOR, "no_repeat_window:NoRepeatWindow"]
    assert json.loads(files[MANIFEST_NAME]) == manifest

    # The instance's unpacking accepts it, wheels and all.
    unpacked = extract_package(archive, tmp_path / "repo")
    assert unpacked["plugins"] == manifest["plugins"]
    assert (tmp_path / "repo" / entry("tiny_bigram")["file"]).is_file()


def test_a_version_without_plugins_has_no_plugins_key(model, release, artifact_root):
    version = package_version(materialized(make_version(model, artifact_root)))
    assert "plugins" not in version.package_manifest
    assert not any("/plugins/" in f["path"] for f in version.package_manifest["files"])


def test_wheels_from_the_artifact_source(team, model, release, artifact_root, api, member):
    version = materialized(
        make_version(model, artifact_root, plugins=[uploaded(team, "tiny_bigram").pk])
    )
    shipped = weights_dir(version) / "plugins"
    shipped.mkdir(parents=True)
    shutil.copy(example_wheels()["no_repeat_window"], shipped)
    version = package_version(version)
    assert version.state == VersionState.READY, version.failure_reason
    assert version.package_manifest["plugins"] == [entry("no_repeat_window"), entry("tiny_bigram")]

    body = api(member).get(f"/api/v1/versions/{version.pk}/").json()
    assert [(p["name"], p["origin"]) for p in body["plugins"]] == [
        ("no-repeat-window", "artifact"), ("tiny-bigram", "uploaded"),
    ]  # fmt: skip

    client = Client()
    client.force_login(member)
    page = client.get(reverse("web:version_detail", args=["search", "ranker", version.number]))
    text = page.content.decode()
    assert (
        "logits processor no_repeat_window → <code>no_repeat_window:NoRepeatWindow</code>" in text
    )
    assert "general plugin tiny_bigram → <code>tiny_bigram:register</code>" in text
    assert "artifact (plugins/)" in text


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: make_wheel(d, "old", requires=["vllm==0.11"],
                              entry_points={"vllm.general_plugins": {"old": "old:register"}}),
         "requires vllm==0.11, the release triton-26.07 pins vllm 0.24.0"),
        (lambda d: (d / "helper-1.0.tar.gz", (d / "helper-1.0.tar.gz").write_bytes(b"sdist"))[0],
         "only wheels"),
        (lambda d: make_wheel(d, "clash",
                              entry_points={"vllm.logits_processors": {"no_repeat_window": "c:P"}}),
         "both declare the entry point 'no_repeat_window'"),
    ],
)  # fmt: skip
def test_a_refused_artifact_wheel_fails_the_version(team, model, release, artifact_root, make,
                                                     needle):  # fmt: skip
    version = materialized(
        make_version(model, artifact_root, plugins=[uploaded(team, "no_repeat_window").pk])
    )
    shipped = weights_dir(version) / "plugins"
    shipped.mkdir(parents=True)
    make(shipped)
    version = package_version(version)
    assert version.state == VersionState.FAILED
    assert version.failure_reason.startswith("Packaging failed: ")
    assert needle in version.failure_reason
    assert not version.package_digest
