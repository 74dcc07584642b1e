"""Server-side checks of the portal's pages: every form's validation messages, team scoping
(another team's pages are 404), roles, and the live deployment fragment."""

from __future__ import annotations

import html as html_lib
import json
import re
from html.parser import HTMLParser

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    Instance,
    InstanceState,
    ObservedState,
)
from portal.metrics.services import scrape_live_instances
from portal.registry.models import ModelVersion
from tests.factories import (
    TAGGER_IO,
    make_deployment,
    make_model,
    make_python_version,
    make_version,
)
from tests.metrics.helpers import Answer, EngineExposition, add_instance, loopback_source

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page_html(user, view: str, *args) -> str:
    """The HTML ``user`` gets for the view named ``view`` with URL arguments ``args``."""
    return signed_in(user).get(reverse(view, args=args)).content.decode()


def errors_of(response) -> list[str]:
    """The text of every inline field error and form-level error on the page."""
    html = response.content.decode()
    found = re.findall(r'<ul class="errors"[^>]*>(.*?)</ul>', html, re.S)
    found += re.findall(r'<div class="form-errors"[^>]*>(.*?)</div>', html, re.S)
    return [html_lib.unescape(re.sub(r"<[^>]+>", " ", chunk)) for chunk in found]


def has_error(response, text: str) -> bool:
    return any(text in chunk for chunk in errors_of(response))


# --- sign-in and navigation ---------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_sign_in(team):
    response = Client().get(reverse("web:dashboard", args=[team.slug]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("web:login"))


def test_sign_in_with_a_wrong_password_says_so(member):
    response = Client().post(reverse("web:login"), {"username": "mia", "password": "nope"})
    assert response.status_code == 200
    assert has_error(response, "correct username and password")


def test_sign_in_opens_the_team_dashboard(member, team):
    client = Client()
    response = client.post(
        reverse("web:login"), {"username": "mia", "password": "pw-mia"}, follow=True
    )
    assert response.redirect_chain[-1][0] == reverse("web:dashboard", args=[team.slug])
    assert b"Register model" in response.content


def test_the_team_switcher_lists_only_the_users_teams(member, team, other_team):
    page = page_html(member, "web:dashboard", team.slug)
    assert f'href="/t/{team.slug}/"' in page
    assert f'href="/t/{other_team.slug}/"' not in page


# --- team scoping ------------------------------------------------------------------------------


@pytest.fixture
def foreign(other_team, release, artifact_root, cpu_instance_type):
    """Another team's model, version and deployment."""
    model = make_model(other_team, "secret-model")
    version = make_version(model, artifact_root)
    return model, version, make_deployment(model, version, cpu_instance_type)


def test_another_teams_pages_are_404(member, other_team, foreign):
    model, version, deployment = foreign
    client = signed_in(member)
    urls = [
        reverse("web:dashboard", args=[other_team.slug]),
        reverse("web:tokens", args=[other_team.slug]),
        reverse("web:caller_keys", args=[other_team.slug]),
        reverse("web:model_detail", args=[other_team.slug, model.slug]),
        reverse("web:version_detail", args=[other_team.slug, model.slug, version.number]),
        reverse("web:deployment_detail", args=[other_team.slug, deployment.pk]),
        reverse("web:deployment_live", args=[other_team.slug, deployment.pk]),
        reverse("web:deployment_metrics", args=[other_team.slug, deployment.pk]),
    ]
    for url in urls:
        assert client.get(url).status_code == 404, url
    act = reverse("web:deployment_act", args=[other_team.slug, deployment.pk, "pause"])
    assert client.post(act).status_code == 404
    assert not DeploymentEvent.objects.filter(deployment=deployment, kind="action").exists()


def test_a_deployment_is_not_reachable_through_the_wrong_team(member, team, foreign):
    _, _, deployment = foreign
    url = reverse("web:deployment_detail", args=[team.slug, deployment.pk])
    assert signed_in(member).get(url).status_code == 404


def test_viewers_see_pages_but_cannot_change_anything(viewer, team, model):
    client = signed_in(viewer)
    page = client.get(reverse("web:dashboard", args=[team.slug]))
    assert page.status_code == 200 and b"Register model" not in page.content
    response = client.post(
        reverse("web:model_new", args=[team.slug]), {"slug": "x", "task": "chat"}
    )
    assert response.status_code == 403
    assert not team.models.filter(slug="x").exists()


# --- register model ----------------------------------------------------------------------------


def test_register_model_validation_messages(member, team, model):
    client = signed_in(member)
    url = reverse("web:model_new", args=[team.slug])
    assert has_error(client.post(url, {"slug": "", "task": "chat"}), "This field is required")
    assert has_error(client.post(url, {"slug": "has space", "task": "chat"}), "letters")
    taken = client.post(url, {"slug": model.slug, "task": "chat"})
    assert has_error(taken, "already has a model")
    assert has_error(client.post(url, {"slug": "ok", "task": "poetry"}), "valid choice")


def test_register_model_then_add_its_first_version(member, team, release, artifact_root):
    client = signed_in(member)
    response = client.post(
        reverse("web:model_new", args=[team.slug]), {"slug": "chat-bot", "task": "chat"}
    )
    assert response["Location"] == reverse("web:version_new", args=[team.slug, "chat-bot"])
    response = client.post(
        response["Location"],
        {
            "artifact_uri": f"file://{artifact_root}/chat-bot",
            "backend": "vllm",
            "api_surface": "openai+grpc",
            "engine_args": '{"max_model_len": 2048}',
            "constraint_plugins": ["platform-constraints"],
        },
    )
    version = ModelVersion.objects.get(model__slug="chat-bot")
    assert response["Location"] == reverse("web:version_detail", args=[team.slug, "chat-bot", 1])
    assert version.engine_args == {"max_model_len": 2048}
    assert version.constraint_plugins == ["platform-constraints"]
    page = client.get(response["Location"]).content.decode()
    assert "Registered" in page and "hx-trigger" in page  # polls until ready or failed


# --- add version -------------------------------------------------------------------------------


def vllm_form(artifact_root, **overrides):
    data = {
        "artifact_uri": f"file://{artifact_root}/ranker",
        "backend": "vllm",
        "api_surface": "openai+grpc",
        "engine_args": "",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("overrides", "field_text"),
    [
        ({"engine_args": "{max_model_len: 1}"}, "Not valid JSON"),
        ({"engine_args": "[1, 2]"}, "Must be a JSON object"),
        ({"engine_args": '{"no_such_arg": 1}'}, "no_such_arg"),
        ({"engine_args": '{"vllm_version": "0.1"}'}, "pinned"),
        ({"artifact_uri": "ftp://example.com/model"}, "s3://"),
        ({"artifact_uri": "file:///etc/passwd"}, "allowed"),
        ({"backend": "python", "io_spec": ""}, "The Python backend needs inputs and outputs"),
        ({"backend": "python", "io_spec": '{"inputs": []}'}, "must be a non-empty list"),
        ({"constraint_plugins": ["no-such-plugin"]}, "valid choice"),
    ],
)
def test_add_version_validation_messages(
    member, team, model, release, artifact_root, overrides, field_text
):
    response = signed_in(member).post(
        reverse("web:version_new", args=[team.slug, model.slug]),
        vllm_form(artifact_root, **overrides),
    )
    assert response.status_code == 200
    assert has_error(response, field_text), errors_of(response)
    assert not model.versions.exists()


def test_add_a_python_backend_version_with_an_uploaded_model_py(
    member, team, model, release, artifact_root
):
    source = b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    response = signed_in(member).post(
        reverse("web:version_new", args=[team.slug, model.slug]),
        vllm_form(
            artifact_root,
            backend="python",
            api_surface="grpc",
            io_spec=json.dumps(TAGGER_IO),
            python_model=SimpleUploadedFile("model.py", source),
        ),
    )
    assert response.status_code == 302, errors_of(response)
    version = model.versions.get()
    assert version.backend == "python" and version.io_spec == TAGGER_IO
    assert version.python_model == source.decode()


# --- deploy ------------------------------------------------------------------------------------


def test_deploy_form_validation_messages(member, team, deploy_url, deploy_fields):
    client = signed_in(member)
    url, base = deploy_url, deploy_fields
    assert has_error(client.post(url, {**base, "stages": "ten"}), "Write whole percentages")
    assert has_error(client.post(url, {**base, "stages": "50, 10"}), "increasing")
    assert has_error(client.post(url, {**base, "replicas": 0}), "greater than or equal to 1")
    assert has_error(client.post(url, {**base, "max_error_rate": 2}), "less than or equal to 1")
    assert not Deployment.objects.exists()
    response = client.post(url, base)
    deployment = Deployment.objects.get()
    assert response["Location"] == reverse("web:deployment_detail", args=[team.slug, deployment.pk])


def test_deploy_shows_the_advice_and_refuses_an_interface_change_red_black(
    member, team, model, release, artifact_root, cpu_instance_type
):
    v1 = make_version(model, artifact_root)
    deployment = make_deployment(model, v1, cpu_instance_type)
    Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.SERVING)
    v2 = make_python_version(model, artifact_root, TAGGER_IO)
    client = signed_in(member)
    url = reverse("web:deploy", args=[team.slug, model.slug])
    page = client.get(url + f"?version={v2.number}").content.decode()
    assert "Advice: Versioned" in page and "The interface changed" in page
    assert "Temporary cost of Versioned" in page
    response = client.post(
        url,
        {
            "version": v2.pk,
            "strategy": "red_black",
            "replicas": 1,
            "instance_type": cpu_instance_type.pk,
            "stages": "50, 100",
            "bake_seconds": 0,
            "health_deadline_seconds": 60,
            "max_error_rate": 0.05,
        },
    )
    assert has_error(response, "changes the model's interface"), errors_of(response)
    deployment.refresh_from_db()
    assert deployment.target_version == v1


def test_deploying_red_black_again_rolls_the_live_deployment_onto_the_new_version(
    member, team, model, release, artifact_root, cpu_instance_type
):
    v1 = make_version(model, artifact_root)
    deployment = make_deployment(model, v1, cpu_instance_type)
    Deployment.objects.filter(pk=deployment.pk).update(observed_state=ObservedState.SERVING)
    v2 = make_version(model, artifact_root)
    response = signed_in(member).post(
        reverse("web:deploy", args=[team.slug, model.slug]),
        {
            "version": v2.pk,
            "strategy": "red_black",
            "replicas": 2,
            "instance_type": cpu_instance_type.pk,
            "stages": "25, 100",
            "bake_seconds": 5,
            "health_deadline_seconds": 60,
            "max_error_rate": 0.1,
        },
    )
    assert response["Location"].endswith(f"/deployments/{deployment.pk}/")
    deployment.refresh_from_db()
    assert (deployment.target_version, deployment.previous_version) == (v2, v1)
    assert (deployment.replicas, deployment.stages, deployment.bake_seconds) == (2, [25, 100], 5)


# --- the deployment page -------------------------------------------------------------------------


def test_the_deployment_page_shows_how_to_call_it(member, team, deployment):
    page = signed_in(member).get(reverse("web:deployment_detail", args=[team.slug, deployment.pk]))
    html = page.content.decode()
    # One base URL, with no /v1 that reads like a version.
    assert "/models/search/ranker" in html and "/models/search/ranker/v1" not in html
    assert "search--ranker" in html
    assert "OpenAI(base_url=" in html
    # Called with a caller key from the environment, and a link to where keys are made.
    assert 'api_key=os.environ["MODEL_API_KEY"]' in html
    assert '-H "Authorization: Bearer $MODEL_API_KEY"' in html
    assert "unused" not in html
    assert f'href="{reverse("web:caller_keys", args=[team.slug])}"' in html


def test_a_kserve_only_deployment_shows_its_kserve_endpoints_and_tritonclient_snippets(
    member, team, model, release, artifact_root, cpu_instance_type
):
    version = make_python_version(model, artifact_root, {**TAGGER_IO, "max_batch_size": 8})
    deployment = make_deployment(model, version, cpu_instance_type)
    Instance.objects.create(
        deployment=deployment,
        version=version,
        name="search-ranker-v1-a",
        endpoints={"kserve_grpc": "127.0.0.1:45001"},
        state=InstanceState.READY,
    )
    html = html_lib.unescape(page_html(member, "web:deployment_detail", team.slug, deployment.pk))
    assert "OpenAI(base_url=" not in html and "/chat/completions" not in html
    assert "http://127.0.0.1:8080/models/search/ranker</code>" in html
    assert "<code>127.0.0.1:45001</code>" in html
    # The programs are written from the version's I/O spec: its names, wire types and a batch
    # dimension, since the model batches.
    assert "InferenceServerClient('127.0.0.1:8080/models/search/ranker')" in html
    assert "InferenceServerClient('127.0.0.1:45001')" in html
    assert "InferInput('TEXT', [1, 1], 'BYTES')" in html
    assert "print('TAGS', result.as_numpy('TAGS'))" in html
    assert "client.infer('search--ranker', inputs)" in html  # gRPC: straight to the instance
    # HTTP goes through the gateway: with the caller key from the environment.
    assert "client.infer('search--ranker', inputs, headers=headers)" in html
    assert """os.environ['MODEL_API_KEY']""" in html
    assert reverse("web:caller_keys", args=[team.slug]) in html


def test_the_live_fragment_answers_204_until_something_changes(member, team, deployment):
    client = signed_in(member)
    url = reverse("web:deployment_live", args=[team.slug, deployment.pk])
    first = client.get(url)
    tag = re.search(r"tag=([0-9a-f]+)", first.content.decode()).group(1)
    newest = re.search(r"seen=(\d+)", first.content.decode()).group(1)
    assert client.get(url, {"tag": tag, "seen": newest}).status_code == 204
    client.post(reverse("web:deployment_act", args=[team.slug, deployment.pk, "pause"]))
    changed = client.get(url, {"tag": tag, "seen": newest, "state": "pending"})
    assert changed.status_code == 200
    html = changed.content.decode()
    assert 'class="fresh"' in html and "1 new event" in html and "Pause requested" in html


def test_an_action_that_does_not_apply_now_is_explained(member, team, deployment):
    client = signed_in(member)
    url = reverse("web:deployment_act", args=[team.slug, deployment.pk, "rollback"])
    page = client.post(url, follow=True).content.decode()
    assert "no previous version" in page
    assert (
        client.post(
            reverse("web:deployment_act", args=[team.slug, deployment.pk, "explode"])
        ).status_code
        == 404
    )


def test_only_actions_that_apply_are_offered(member, team, deployment):
    html = page_html(member, "web:deployment_live", team.slug, deployment.pk)
    assert "/pause/" in html and "/abort/" in html
    assert "/rollback/" not in html and "/resume/" not in html


# --- API tokens --------------------------------------------------------------------------------


def test_tokens_are_shown_once_listed_and_revoked(member, team):
    client = signed_in(member)
    url = reverse("web:tokens", args=[team.slug])
    assert has_error(client.post(url, {"name": "", "role": "member"}), "required")
    assert has_error(
        client.post(url, {"name": "ci", "role": "member", "expires_in_days": 0}), "greater"
    )
    created = client.post(url, {"name": "ci-main", "role": "viewer", "expires_in_days": 30})
    plaintext = re.search(r"mlp_[0-9a-f]+_[\w-]+", created.content.decode()).group(0)
    token = ApiToken.objects.get(name="ci-main")
    assert token.role == "viewer" and token.expires_at is not None
    listing = client.get(url).content.decode()
    assert plaintext not in listing and f"mlp_{token.prefix}_" in listing
    api = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert api.get("/api/v1/models/").status_code == 200
    client.post(reverse("web:token_revoke", args=[team.slug, token.pk]))
    assert api.get("/api/v1/models/").status_code == 401


def test_another_teams_token_cannot_be_revoked(member, team, other_team, outsider):
    theirs = issue_token(team=other_team, name="theirs").token
    signed_in(member).post(reverse("web:token_revoke", args=[team.slug, theirs.pk]))
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


# --- metrics on the pages ----------------------------------------------------------------------


def test_metrics_explain_themselves_before_any_sample(member, team, deployment):
    html = page_html(member, "web:deployment_metrics", team.slug, deployment.pk)
    assert 'data-testid="metrics-empty"' in html and "No samples yet" in html
    assert "every 15 s" in html


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"body": "this is { not prometheus"}, "not a Prometheus exposition"),
        ({"hang": True}, "no answer"),
        ({"status": 500, "body": "boom"}, "answered HTTP 500"),
    ],
)
def test_a_broken_source_is_shown_down_and_the_page_still_works(
    member, team, deployment, settings, answer, reason
):
    settings.METRICS_SCRAPE_TIMEOUT_SECONDS = 0.5
    with loopback_source(Answer(**answer)) as source:
        add_instance(deployment, "search-ranker-v1-broken", source.url)
        scrape_live_instances()
        scrape_live_instances()
    client = signed_in(member)
    html = client.get(
        reverse("web:deployment_metrics", args=[team.slug, deployment.pk])
    ).content.decode()
    assert 'data-testid="sources-down"' in html and "search-ranker-v1-broken" in html
    assert reason in html_lib.unescape(html)
    model_page = client.get(reverse("web:model_metrics", args=[team.slug, deployment.model.slug]))
    assert model_page.status_code == 200 and b"Source down" in model_page.content


def test_the_charts_fragment_hands_over_to_its_script(member, team, deployment):
    """The fragment holds no drawing: it names the metrics API, offers the ranges, loads the
    vendored uPlot and static/web/charts.js (tests/web/test_charts_browser.py draws it)."""
    engine = EngineExposition()
    with loopback_source(Answer(body=engine.text())) as source:
        add_instance(deployment, "search-ranker-v1-a", source.url)
        scrape_live_instances()
        engine.serve(ok=30, failed=1)
        source.answer = Answer(body=engine.text())
        scrape_live_instances()
    html = page_html(member, "web:deployment_metrics", team.slug, deployment.pk)
    assert f'data-metrics-api="/api/v1/deployments/{deployment.pk}/metrics/"' in html
    assert re.findall(r'data-range="(\w+)"', html) == ["15m", "1h", "6h", "24h"]
    assert 'data-range="1h" aria-pressed="true"' in html
    assert "vendor/uplot/uPlot.iife.min.js" in html and "web/charts.js" in html
    assert re.search(r'data-testid="metrics-empty" hidden', html)  # there are points
    model_html = page_html(member, "web:model_metrics", team.slug, deployment.model.slug)
    assert f'data-metrics-api="/api/v1/models/{deployment.model_id}/metrics/"' in model_html


# --- accessibility -----------------------------------------------------------------------------


class _Controls(HTMLParser):
    """Form controls of a page and the ids its labels point at (or wrap)."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict[str, str | None]] = []
        self.label_for: set[str] = set()
        self.inside_label = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "label":
            self.inside_label += 1
            if attributes.get("for"):
                self.label_for.add(attributes["for"] or "")
        elif tag in ("input", "select", "textarea"):
            if attributes.get("type") in ("hidden", "submit"):
                return
            self.controls.append({**attributes, "wrapped": "yes" if self.inside_label else None})

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self.inside_label -= 1


def test_every_form_field_has_a_label(member, team, model, version, cpu_instance_type):
    client = signed_in(member)
    pages = [
        reverse("web:model_new", args=[team.slug]),
        reverse("web:version_new", args=[team.slug, model.slug]),
        reverse("web:deploy", args=[team.slug, model.slug]),
        reverse("web:tokens", args=[team.slug]),
        reverse("web:caller_keys", args=[team.slug]),
    ]
    anonymous = Client().get(reverse("web:login")).content.decode()
    for url, html in [(url, client.get(url).content.decode()) for url in pages] + [
        ("login", anonymous)
    ]:
        parsed = _Controls()
        parsed.feed(html)
        assert parsed.controls, url
        for control in parsed.controls:
            labelled = control["wrapped"] or control.get("id") in parsed.label_for
            assert labelled, f"{url}: {control.get('name')} has no label"


def test_a_malformed_version_in_the_deploy_link_is_ignored(member, team, model, version):
    url = reverse("web:deploy", args=[team.slug, model.slug])
    assert signed_in(member).get(url, {"version": "v1'"}).status_code == 200


def test_the_version_form_explains_when_each_backend_fits(member, team, model):
    html = signed_in(member).get(reverse("web:version_new", args=[team.slug, model.slug]))
    assert b"Most LLMs" in html.content and b"Anything vLLM does not run" in html.content


def test_a_posted_version_that_is_not_one_is_a_form_error(
    member, team, model, version, cpu_instance_type
):
    response = signed_in(member).post(
        reverse("web:deploy", args=[team.slug, model.slug]),
        {"version": "abc", "strategy": "red_black", "replicas": 1,
         "instance_type": cpu_instance_type.pk, "stages": "100", "bake_seconds": 0,
         "health_deadline_seconds": 60, "max_error_rate": 0.05},
    )  # fmt: skip
    assert response.status_code == 200 and has_error(response, "valid choice")
    assert not Deployment.objects.exists()
