"""Human-readable renderings: engine arguments as a key/value list, an I/O spec as a table and a
traffic split in words, on the pages and in the admin (never a raw Python dict)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from portal.deployments.models import Deployment
from portal.registry.display import engine_arg_items, io_spec_rows
from portal.web.templatetags.portal_status import traffic
from tests.factories import TAGGER_IO, make_deployment, make_python_version, make_version


def test_engine_arguments_become_sorted_name_value_rows():
    rows = engine_arg_items(
        {"max_model_len": 2048, "enforce_eager": True, "stop": ["a", "b"], "x": None}
    )
    assert rows == [
        ("enforce_eager", "true"),
        ("max_model_len", "2048"),
        ("stop", "a, b"),
        ("x", "null"),
    ]
    assert engine_arg_items({}) == [] and engine_arg_items("nope") == []


def test_an_io_spec_becomes_table_rows():
    spec = {**TAGGER_IO, "max_batch_size": 8}
    spec["inputs"] = [
        *spec["inputs"],
        {"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1, 4], "optional": True},
    ]
    assert io_spec_rows(spec) == [
        {"side": "input", "name": "TEXT", "datatype": "STRING", "dims": "[1]", "optional": ""},
        {
            "side": "input",
            "name": "MASK",
            "datatype": "BOOL",
            "dims": "[-1, 4]",
            "optional": "optional",
        },
        {"side": "output", "name": "TAGS", "datatype": "STRING", "dims": "[-1]", "optional": ""},
    ]


def test_the_traffic_filter_reads_a_split():
    assert traffic({2: 10, 1: 90}, 2) == "v2 10% · v1 90%"
    assert traffic({}) == "no traffic"


@pytest.fixture
def signed_in(member) -> Client:
    client = Client()
    client.force_login(member)
    return client


def test_the_version_page_lists_engine_arguments_and_tabulates_the_io_spec(
    signed_in, team, model, release, artifact_root
):
    vllm = make_version(model, artifact_root, engine_args={"dtype": "auto", "max_model_len": 512})
    page = signed_in.get(reverse("web:version_detail", args=[team.slug, model.slug, vllm.number]))
    html = page.content.decode()
    assert "<code>max_model_len</code></dt><dd><code>512</code>" in html
    assert "{&#x27;" not in html and "{'" not in html
    python = make_python_version(model, artifact_root, TAGGER_IO)
    page = signed_in.get(reverse("web:version_detail", args=[team.slug, model.slug, python.number]))
    html = page.content.decode()
    assert 'data-testid="io-spec"' in html
    assert "<code>TEXT</code></th><td><code>STRING</code></td><td><code>[1]</code>" in html
    assert "TYPE_STRING" not in html and "&#x27;inputs&#x27;" not in html


@pytest.fixture
def operator(db) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_shows_status_and_traffic_in_words(
    operator, model, release, artifact_root, cpu_instance_type
):
    v1 = make_version(model, artifact_root, engine_args={"dtype": "auto"})
    v2 = make_version(model, artifact_root)
    deployment = make_deployment(model, v2, cpu_instance_type)
    Deployment.objects.filter(pk=deployment.pk).update(
        previous_version=v1,
        observed_state="progressing",
        current_stage=1,
        traffic={1: 90, 2: 10},
        step={"phase": "bake"},
    )
    listing = operator.get(reverse("admin:deployments_deployment_changelist")).content.decode()
    assert "Baking v2 at 10% (stage 1 of 3)" in listing
    assert "v2 10% · v1 90%" in listing
    page = operator.get(
        reverse("admin:deployments_deployment_change", args=[deployment.pk])
    ).content.decode()
    assert "v2 10% · v1 90%" in page and "{&#x27;1&#x27;" not in page
    version_page = operator.get(
        reverse("admin:registry_modelversion_change", args=[v1.pk])
    ).content.decode()
    assert "<code>dtype = auto</code>" in version_page


def test_the_model_page_shows_each_live_deployments_headline(
    signed_in, team, model, release, artifact_root, cpu_instance_type
):
    version = make_version(model, artifact_root)
    make_deployment(model, version, cpu_instance_type, strategy="versioned")
    page = signed_in.get(reverse("web:model_detail", args=[team.slug, model.slug]))
    assert "Waiting for v1 to be ready (registered)" in page.content.decode()
