"""The operator admin: every page opens, and its actions go through the services."""

from __future__ import annotations

import hashlib

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.messages import get_messages
from django.core.exceptions import ValidationError
from django.test import Client, RequestFactory
from django.urls import reverse

from portal.accounts.models import ApiToken, CallerKey, Membership, Role
from portal.accounts.tokens import TokenError, authenticate_token, issue_token
from portal.cache.models import Materialization
from portal.core.actors import Actor
from portal.core.models import IdempotencyRecord
from portal.deployments.admin import DeploymentAdmin, EventInline, StageAnalysisInline
from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    DesiredState,
    EventKind,
    Instance,
    MultiRegionDeployment,
    ObservedState,
    Region,
)
from portal.deployments.services import update_deployment
from portal.deployments.traffic.caller_keys import issue_caller_key
from portal.registry.models import PlatformRelease, PluginWheel
from portal.registry.services import create_model, register_version
from serving.gateway import keys as gateway_keys
from tests.factories import make_deployment, make_stage_analysis

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser(
        username="root", email="root@example.com", password="pw-root"
    )


@pytest.fixture
def client(superuser) -> Client:
    client = Client()
    client.force_login(superuser)
    return client


@pytest.fixture
def model(team):
    return create_model(team=team, slug="ranker", task="chat")


@pytest.fixture
def versions(model, release, artifact_root):
    return [
        register_version(model=model, artifact_uri=f"file://{artifact_root}/ranker/{n}")
        for n in (1, 2)
    ]


@pytest.fixture
def rolling_out(model, versions, cpu_instance_type) -> Deployment:
    """A Red-Black deployment moving from v1 (serving) to v2: it has a version to go back to."""
    deployment = make_deployment(model, versions[0], cpu_instance_type)
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="starting")
    transition_deployment(deployment, ObservedState.SERVING, reason="all stages done")
    update_deployment(deployment, actor=Actor(label="user:test"), version=versions[1])
    return transition_deployment(deployment, ObservedState.PROGRESSING, reason="new rollout")


def changelist(model_class) -> str:
    meta = model_class._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")


def change_url(obj) -> str:
    meta = obj._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


def run_action(client, model_class, action: str, objects) -> list[tuple[str, str]]:
    response = client.post(
        changelist(model_class),
        {"action": action, "_selected_action": [obj.pk for obj in objects], "index": 0},
        follow=True,
    )
    assert response.status_code == 200
    return messages_of(response)


# --- Every page opens -------------------------------------------------------------------------


def test_every_registered_model_has_working_changelist_and_change_pages(
    client, superuser, team, member, model, versions, cpu_instance_type
):
    deployment = make_deployment(model, versions[0], cpu_instance_type)
    instance = Instance.objects.create(
        deployment=deployment, version=versions[0], name="local-1234"
    )
    objects = {
        get_user_model(): superuser,
        Group: Group.objects.create(name="operators"),
        type(team): team,
        Membership: Membership.objects.get(user=member),
        ApiToken: issue_token(team=team, name="ci", created_by=member).token,
        CallerKey: issue_caller_key(team=team, name="app", models=[model], created_by=member).key,
        IdempotencyRecord: IdempotencyRecord.objects.create(
            principal="user:1",
            key="k1",
            method="POST",
            path="/api/v1/models/",
            fingerprint="0" * 64,
            status_code=201,
            response_body={"id": 1},
        ),
        type(cpu_instance_type): cpu_instance_type,
        Deployment: deployment,
        DeploymentEvent: deployment.events.get(),
        Region: deployment.region,
        MultiRegionDeployment: MultiRegionDeployment.objects.create(
            model=model, target_version=versions[0]
        ),
        Instance: instance,
        PlatformRelease: versions[0].release,
        type(model): model,
        type(versions[0]): versions[0],
        Materialization: Materialization.objects.get(version=versions[0]),
        PluginWheel: PluginWheel.objects.create(
            team=team,
            sha256="a" * 64,
            filename="p-1.0-py3-none-any.whl",
            name="p",
            version="1.0",
            size=1,
        ),
    }
    assert set(admin.site._registry) == set(objects), "a registered model has no case here"

    for model_class, model_admin in admin.site._registry.items():
        response = client.get(changelist(model_class))
        assert response.status_code == 200, model_class
        assert str(objects[model_class].pk) in response.content.decode()
        if model_admin.search_fields:
            assert client.get(changelist(model_class), {"q": "a"}).status_code == 200, model_class
        response = client.get(change_url(objects[model_class]))
        assert response.status_code == 200, model_class
        meta = model_class._meta
        add_url = reverse(f"admin:{meta.app_label}_{meta.model_name}_add")
        expected = 200 if model_admin.has_add_permission(response.wsgi_request) else 403
        assert client.get(add_url).status_code == expected, model_class

    assert client.get(reverse("admin:index")).status_code == 200


# --- Model cache ---------------------------------------------------------------------------


def test_cache_changelist_shows_usage_and_pins(client, versions, settings):
    blob = settings.MODEL_CACHE_ROOT / "blobs" / "sha256" / "ab" / ("ab" * 32)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x" * 2048)
    records = [Materialization.objects.create(version=v, tree=f"t/{v.pk}") for v in versions]

    page = client.get(changelist(Materialization)).content.decode()
    assert "2.0\xa0KB in 1 distinct files" in page
    assert "no size limit set" in page

    run_action(client, Materialization, "pin", records[:1])
    assert [r.pinned for r in Materialization.objects.order_by("pk")] == [True] + [False] * (
        len(records) - 1
    )


# --- Platform releases ------------------------------------------------------------------------


def test_make_default_leaves_exactly_one_default_and_versions_keep_their_release(
    client, release, versions
):
    newer = PlatformRelease.objects.create(
        name="triton-26.09",
        triton_image="nvcr.io/nvidia/tritonserver:26.09-vllm-python-py3",
        vllm_version="0.25.0",
        allowed_engine_args=["dtype"],
    )
    messages = run_action(client, PlatformRelease, "make_default", [newer])

    assert PlatformRelease.objects.filter(is_default=True).get() == newer
    assert [m for level, m in messages if level == "info"] == [
        "triton-26.09 is now the default; existing versions keep theirs."
    ]
    for version in versions:
        version.refresh_from_db()
        assert version.release == release


def test_make_default_refuses_more_than_one_release(client, release):
    other = PlatformRelease.objects.create(
        name="triton-26.09", triton_image="img:26.09", vllm_version="0.25.0"
    )
    messages = run_action(client, PlatformRelease, "make_default", [release, other])

    assert ("error", "Select exactly one release.") in messages
    assert PlatformRelease.objects.filter(is_default=True).get() == release


def test_release_pin_is_frozen_once_versions_use_it(client, release, versions):
    response = client.get(change_url(release))
    form = response.context["adminform"].form
    assert "vllm_version" not in form.fields
    assert "triton_image" not in form.fields


# --- API tokens -------------------------------------------------------------------------------


def test_revoke_action_revokes_and_the_token_stops_working(client, team, member):
    issued = issue_token(team=team, name="ci", created_by=member)
    assert authenticate_token(issued.plaintext) == issued.token

    messages = run_action(client, ApiToken, "revoke", [issued.token])

    issued.token.refresh_from_db()
    assert issued.token.revoked_at is not None
    assert ("info", "Revoked 1 token(s).") in messages
    with pytest.raises(TokenError, match="revoked"):
        authenticate_token(issued.plaintext)


def test_creating_a_token_in_the_admin_shows_the_plaintext_once_and_stores_a_digest(
    client, superuser, team
):
    response = client.post(
        reverse("admin:accounts_apitoken_add"),
        {"team": team.pk, "name": "deploy-bot", "role": Role.VIEWER},
        follow=True,
    )
    assert response.status_code == 200

    token = ApiToken.objects.get(name="deploy-bot")
    shown = [m for level, m in messages_of(response) if level == "warning"]
    assert len(shown) == 1
    plaintext = shown[0].rsplit(" ", 1)[-1]
    assert plaintext.startswith(f"mlp_{token.prefix}_")
    assert token.digest == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in str(ApiToken.objects.filter(pk=token.pk).values().get())
    assert (token.team, token.role, token.created_by) == (team, Role.VIEWER, superuser)
    assert authenticate_token(plaintext) == token
    # The success message names the token as stored, with its prefix.
    assert any(token.prefix in m for level, m in messages_of(response) if level == "success")

    # Shown once: the token's own page never shows it again.
    assert plaintext not in client.get(change_url(token)).content.decode()


# --- Caller keys ------------------------------------------------------------------------------


def test_creating_a_caller_key_in_the_admin_shows_the_plaintext_once_and_publishes_it(
    client, superuser, team, model, clean_redis, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            reverse("admin:accounts_callerkey_add"),
            {"team": team.pk, "name": "search-app", "models": [model.pk], "tokens_per_minute": 600},
            follow=True,
        )
    assert response.status_code == 200

    key = CallerKey.objects.get(name="search-app")
    shown = [m for level, m in messages_of(response) if level == "warning"]
    assert len(shown) == 1
    plaintext = shown[0].rsplit(" ", 1)[-1]
    assert plaintext.startswith(f"mlk_{key.prefix}_")
    assert key.digest == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in str(CallerKey.objects.filter(pk=key.pk).values().get())
    assert (key.team, list(key.models.all()), key.tokens_per_minute, key.created_by) == (
        team,
        [model],
        600,
        superuser,
    )
    table = gateway_keys.parse(clean_redis.get("gateway:keys"))
    assert table.authenticate(plaintext, "search/ranker").key.limits.tokens_per_minute == 600

    assert plaintext not in client.get(change_url(key)).content.decode()
    assert plaintext not in client.get(changelist(CallerKey)).content.decode()


def test_a_caller_key_for_another_teams_model_is_refused_in_the_form(client, other_team, model):
    response = client.post(
        reverse("admin:accounts_callerkey_add"),
        {"team": other_team.pk, "name": "sneaky", "models": [model.pk]},
    )
    assert response.status_code == 200  # the form again, with the error
    assert "can only call its own models" in response.content.decode()
    assert not CallerKey.objects.exists()


def test_caller_key_revoke_action_unpublishes_the_key(
    client, team, member, clean_redis, django_capture_on_commit_callbacks
):
    issued = issue_caller_key(team=team, name="app", created_by=member)
    with django_capture_on_commit_callbacks(execute=True):
        messages = run_action(client, CallerKey, "revoke", [issued.key])

    issued.key.refresh_from_db()
    assert issued.key.revoked_at is not None
    assert ("info", "Revoked 1 caller key(s).") in messages
    assert gateway_keys.parse(clean_redis.get("gateway:keys")).keys == {}


def test_a_caller_key_changed_in_the_admin_is_published_again(
    client, team, member, model, clean_redis, django_capture_on_commit_callbacks
):
    issued = issue_caller_key(team=team, name="app", created_by=member)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            change_url(issued.key),
            {"team": team.pk, "name": "app", "models": [model.pk], "requests_per_second": "0.5"},
        )
    assert response.status_code == 302, response.content.decode()
    [entry] = gateway_keys.parse(clean_redis.get("gateway:keys")).keys.values()
    assert (entry.models, entry.limits) == (("ranker",), gateway_keys.Limits(0.5, None))


def test_team_rate_limits_saved_in_the_admin_are_published(
    client, team, clean_redis, django_capture_on_commit_callbacks
):
    page = client.get(change_url(team)).content.decode()
    assert "Rate limits" in page and "tokens_per_minute" in page
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            change_url(team),
            {
                "slug": team.slug,
                "name": team.name,
                "requests_per_second": "2.5",
                "tokens_per_minute": "",
                "memberships-TOTAL_FORMS": 0,
                "memberships-INITIAL_FORMS": 0,
            },
        )
    assert response.status_code == 302, response.content.decode()
    team.refresh_from_db()
    assert team.requests_per_second == 2.5
    assert gateway_keys.parse(clean_redis.get("gateway:keys")).teams == {
        "search": gateway_keys.Limits(2.5, None)
    }


# --- Deployments ------------------------------------------------------------------------------


def test_request_rollback_records_an_operator_event(client, superuser, rolling_out):
    before = rolling_out.events.count()

    messages = run_action(client, Deployment, "request_rollback", [rolling_out])

    rolling_out.refresh_from_db()
    assert rolling_out.desired_state == DesiredState.ROLLBACK
    assert ("info", f"Deployment {rolling_out.pk}: rollback requested.") in messages
    assert rolling_out.events.count() == before + 1
    event = rolling_out.events.latest("id")
    assert event.kind == EventKind.ACTION
    assert event.actor_label == "operator:root"
    assert event.actor == superuser
    assert (event.from_state, event.to_state) == (DesiredState.ACTIVE, DesiredState.ROLLBACK)


def test_request_rollback_without_a_previous_version_is_an_error(
    client, model, versions, cpu_instance_type
):
    deployment = make_deployment(model, versions[0], cpu_instance_type)
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="starting")
    events = deployment.events.count()

    messages = run_action(client, Deployment, "request_rollback", [deployment])

    deployment.refresh_from_db()
    assert deployment.desired_state == DesiredState.ACTIVE
    assert deployment.events.count() == events
    errors = [m for level, m in messages if level == "error"]
    assert len(errors) == 1
    assert "no previous version" in errors[0]
    assert not [m for level, m in messages if level == "info"]


def test_request_abort(client, model, versions, cpu_instance_type):
    pending = make_deployment(model, versions[0], cpu_instance_type)
    serving = make_deployment(model, versions[1], cpu_instance_type, strategy="versioned")
    transition_deployment(serving, ObservedState.PROGRESSING, reason="starting")
    transition_deployment(serving, ObservedState.SERVING, reason="done")

    messages = run_action(client, Deployment, "request_abort", [pending, serving])

    pending.refresh_from_db()
    serving.refresh_from_db()
    assert pending.desired_state == DesiredState.ABORTED
    assert pending.events.latest("id").actor_label == "operator:root"
    assert serving.desired_state == DesiredState.ACTIVE
    assert ("info", f"Deployment {pending.pk}: abort requested.") in messages
    errors = [m for level, m in messages if level == "error"]
    assert len(errors) == 1
    assert errors[0].startswith(f"Deployment {serving.pk}: Cannot abort")


def test_pause_resume_and_promote_from_the_admin(client, rolling_out):
    transition_deployment(rolling_out, ObservedState.PROGRESSING, reason="stage 1")
    for action, desired in (
        ("request_pause", DesiredState.PAUSED),
        ("request_resume", DesiredState.ACTIVE),
        ("request_promote", DesiredState.ACTIVE),
    ):
        messages = run_action(client, Deployment, action, [rolling_out])
        verb = action.removeprefix("request_")
        assert ("info", f"Deployment {rolling_out.pk}: {verb} requested.") in messages
        rolling_out.refresh_from_db()
        assert rolling_out.desired_state == desired
        assert rolling_out.events.latest("id").actor_label == "operator:root"
    assert rolling_out.promote_requested


def test_deployment_change_page_is_read_only(client, rolling_out):
    """Desired state changes only through the services (validated, with an event): the admin
    form cannot edit replicas, stages or the instance type behind their back."""
    response = client.get(change_url(rolling_out))
    assert response.status_code == 200
    assert not response.context["has_change_permission"]
    events = rolling_out.events.count()

    response = client.post(
        change_url(rolling_out),
        {"replicas": 7, "stages": "[5]", "bake_seconds": 1, "instance_type": ""},
    )

    assert response.status_code == 403
    rolling_out.refresh_from_db()
    assert (rolling_out.replicas, rolling_out.stages) == (1, [10, 50, 100])
    assert rolling_out.events.count() == events


def test_the_deployment_page_shows_each_bakes_canary_analysis_read_only(client, rolling_out):
    make_stage_analysis(
        rolling_out,
        verdicts=[{"name": "latency_s", "verdict": "fail", "reason": "p50 0.6 s vs 0.2 s"}],
    )
    response = client.get(change_url(rolling_out))
    assert response.status_code == 200
    page = response.content.decode()
    assert "rolled back to v1" in page and "p50 0.6 s vs 0.2 s" in page
    inline = StageAnalysisInline(Deployment, admin.site)
    assert not inline.has_add_permission(None, rolling_out)
    assert not inline.has_change_permission(None, rolling_out)


# --- The timeline is append-only --------------------------------------------------------------


def test_event_inline_and_admin_are_read_only(superuser, rolling_out):
    request = RequestFactory().get("/")
    request.user = superuser

    event_admin = admin.site._registry[DeploymentEvent]
    assert not event_admin.has_add_permission(request)
    assert not event_admin.has_change_permission(request, rolling_out.events.first())
    assert not event_admin.has_delete_permission(request, rolling_out.events.first())
    assert event_admin.has_view_permission(request)

    deployment_admin = admin.site._registry[Deployment]
    assert isinstance(deployment_admin, DeploymentAdmin)
    inlines = deployment_admin.get_inline_instances(request, rolling_out)
    inline = next(i for i in inlines if isinstance(i, EventInline))
    assert not inline.has_add_permission(request, rolling_out)
    assert not inline.has_change_permission(request, rolling_out)
    assert not inline.get_formset(request, rolling_out).can_delete


def test_event_admin_refuses_add_change_and_delete(client, rolling_out):
    event = rolling_out.events.first()
    assert client.get(reverse("admin:deployments_deploymentevent_add")).status_code == 403
    assert client.post(change_url(event), {"message": "rewritten"}).status_code == 403
    delete = reverse("admin:deployments_deploymentevent_delete", args=[event.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    event.refresh_from_db()
    assert event.message != "rewritten"


def test_deployments_are_never_deleted_from_the_admin(client, rolling_out):
    """A live one is stopped through the controller (abort); an ended one is history."""
    listing = client.get(reverse("admin:deployments_deployment_changelist")).content.decode()
    assert "delete_selected" not in listing and "Abort the rollout in progress" in listing
    delete = reverse("admin:deployments_deployment_delete", args=[rolling_out.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert Deployment.objects.filter(pk=rolling_out.pk).exists()


def test_events_cannot_be_updated_or_deleted(rolling_out):
    event = rolling_out.events.first()
    event.message = "rewritten"
    with pytest.raises(ValidationError, match="append-only"):
        event.save()
    with pytest.raises(ValidationError, match="append-only"):
        event.delete()
    assert DeploymentEvent.objects.get(pk=event.pk).message != "rewritten"
