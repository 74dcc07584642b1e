"""The deploy form's Scaling section, server-side: a fixed count or an autoscaling policy, the
service's refusals next to their fields, and a live deployment's policy offered as it is."""

from __future__ import annotations

import pytest
from django.urls import reverse

from portal.deployments.models import Deployment, DeploymentEvent, ObservedState
from tests.factories import TAGGER_IO, make_deployment, make_python_version, make_version
from tests.web.test_browser import browser_page  # noqa: F401  (a fixture)
from tests.web.test_pages import errors_of, has_error, signed_in

pytestmark = pytest.mark.django_db

POLICY = {
    "autoscale": "on",
    "min_replicas": 2,
    "max_replicas": 5,
    "scale_metric": "waiting",
    "scale_target": "1.5",
    "scale_up_window_seconds": 20,
    "scale_down_window_seconds": 120,
    "scale_to_zero_after_seconds": "",
}


def policy_of(deployment: Deployment) -> tuple:
    return (
        deployment.replicas,
        deployment.min_replicas,
        deployment.max_replicas,
        deployment.scale_metric,
        deployment.scale_target,
        deployment.scale_up_window_seconds,
        deployment.scale_down_window_seconds,
        deployment.scale_to_zero_after_seconds,
    )


def test_the_form_has_a_scaling_section_closed_for_a_fixed_count(member, deploy_url, version):
    page = signed_in(member).get(deploy_url).content.decode()
    assert 'data-testid="scaling"' in page and 'data-testid="scaling" open' not in page
    for name in POLICY:
        assert f'name="{name}"' in page, name
    assert "web/scaling_form.js" in page
    assert "Scale to zero after (s)" in page


def test_the_form_creates_an_autoscaling_deployment(member, team, deploy_url, deploy_fields):
    response = signed_in(member).post(deploy_url, {**deploy_fields, **POLICY})
    deployment = Deployment.objects.get()
    assert response.status_code == 302, errors_of(response)
    assert response["Location"] == reverse("web:deployment_detail", args=[team.slug, deployment.pk])
    # It starts at the minimum (the fixed replicas are not used), scale to zero blank is off.
    assert policy_of(deployment) == (2, 2, 5, "waiting", 1.5, 20, 120, None)
    event = DeploymentEvent.objects.get(deployment=deployment)
    assert "2-5 replicas on waiting requests per instance 1.5" in event.message


def test_blank_settings_take_the_defaults_and_scale_to_zero_is_set(
    member, deploy_url, deploy_fields
):
    given = {
        **POLICY,
        "scale_metric": "kv_cache",
        "scale_target": "",
        "scale_to_zero_after_seconds": 600,
    }
    response = signed_in(member).post(deploy_url, {**deploy_fields, **given})
    assert response.status_code == 302, errors_of(response)
    deployment = Deployment.objects.get()
    assert (deployment.scale_metric, deployment.scale_target) == ("kv_cache", 0.7)
    assert deployment.scale_to_zero_after_seconds == 600


def test_min_above_max_is_shown_next_to_the_field(member, deploy_url, deploy_fields):
    response = signed_in(member).post(deploy_url, {**deploy_fields, **POLICY, "min_replicas": 6})
    assert response.status_code == 200
    assert not Deployment.objects.exists()
    form = response.context["form"]
    assert form.errors == {"max_replicas": ["Must be at least min_replicas (6)."]}
    assert has_error(response, "Must be at least min_replicas (6).")
    page = response.content.decode()
    assert 'data-testid="scaling" open' in page  # the error is in view without a script
    assert 'id="id_max_replicas_errors"' in page


@pytest.mark.parametrize(
    ("given", "field", "words"),
    [
        ({"scale_metric": "kv_cache", "scale_target": "2"}, "scale_target", "at most 1"),
        ({"scale_target": "0"}, "scale_target", "greater than or equal to 0.01"),
        ({"scale_up_window_seconds": 4000}, "scale_up_window_seconds", "less than or equal"),
        ({"max_replicas": ""}, "max_replicas", "Required to autoscale."),
        ({"scale_to_zero_after_seconds": 3}, "scale_to_zero_after_seconds", "greater than"),
    ],
)
def test_bad_policy_settings_are_refused_by_field(
    member, deploy_url, deploy_fields, given, field, words
):
    response = signed_in(member).post(deploy_url, {**deploy_fields, **POLICY, **given})
    assert response.status_code == 200
    assert not Deployment.objects.exists()
    errors = response.context["form"].errors
    assert list(errors) == [field], errors
    assert words in errors[field][0]


def test_scale_to_zero_on_a_grpc_version_is_refused_next_to_the_field(
    member, deploy_url, deploy_fields, model, artifact_root
):
    version = make_python_version(model, artifact_root, TAGGER_IO)
    given = {**POLICY, "version": version.pk, "scale_to_zero_after_seconds": 600}
    response = signed_in(member).post(deploy_url, {**deploy_fields, **given})
    assert response.status_code == 200
    assert not Deployment.objects.exists()
    errors = response.context["form"].errors
    assert list(errors) == ["scale_to_zero_after_seconds"], errors
    assert "gRPC" in errors["scale_to_zero_after_seconds"][0]


def test_without_autoscale_the_policy_fields_are_ignored(member, deploy_url, deploy_fields):
    # Hidden by the script while Autoscale is off: neither used nor judged.
    ignored = {k: v for k, v in POLICY.items() if k != "autoscale"} | {"min_replicas": 9}
    response = signed_in(member).post(deploy_url, {**deploy_fields, **ignored, "replicas": 3})
    assert response.status_code == 302, errors_of(response)
    assert policy_of(Deployment.objects.get()) == (3, 3, 3, "in_flight", 4.0, 10, 300, None)


def test_a_fixed_count_needs_its_replicas(member, deploy_url, deploy_fields):
    response = signed_in(member).post(deploy_url, {**deploy_fields, "replicas": ""})
    assert response.context["form"].errors == {"replicas": ["This field is required."]}
    assert not Deployment.objects.exists()


def test_rolling_the_live_deployment_offers_and_keeps_its_policy(
    member, team, deploy_url, model, version, artifact_root, cpu_instance_type, deploy_fields
):
    live = make_deployment(
        model,
        version,
        cpu_instance_type,
        scaling={"min_replicas": 1, "max_replicas": 4, "scale_to_zero_after_seconds": 300},
    )
    Deployment.objects.filter(pk=live.pk).update(observed_state=ObservedState.SERVING, replicas=3)
    live.refresh_from_db()
    v2 = make_version(model, artifact_root)
    client = signed_in(member)
    form = client.get(deploy_url).context["form"]
    assert form.initial["autoscale"] is True
    assert (form.initial["min_replicas"], form.initial["max_replicas"]) == (1, 4)
    assert form.initial["scale_to_zero_after_seconds"] == 300

    # Posted back as offered: the policy and the autoscaler's count stay as they are.
    posted = {
        **deploy_fields,
        "version": v2.pk,
        "replicas": 3,
        "autoscale": "on",
        **{k: form.initial[k] for k in POLICY if k != "autoscale"},
    }
    response = client.post(deploy_url, posted)
    assert response.status_code == 302, errors_of(response)
    live.refresh_from_db()
    assert live.target_version == v2
    assert policy_of(live) == (3, 1, 4, "in_flight", 4.0, 10, 300, 300)
    assert not live.events.filter(kind="updated").exists()

    # Autoscale off: a fixed count, scale to zero off, recorded as an update.
    Deployment.objects.filter(pk=live.pk).update(observed_state=ObservedState.SERVING)
    response = client.post(deploy_url, {**posted, "autoscale": "", "replicas": 2})
    assert response.status_code == 302, errors_of(response)
    live.refresh_from_db()
    assert policy_of(live) == (2, 2, 2, "in_flight", 4.0, 10, 300, None)
    assert live.events.filter(kind="updated").exists()


def test_the_admin_shows_the_policy_and_the_decisions_read_only(
    admin_client, model, version, cpu_instance_type
):
    from portal.deployments.state.autoscaling import Decision, ScalingState

    deployment = make_deployment(
        model, version, cpu_instance_type, scaling={"min_replicas": 1, "max_replicas": 4}
    )
    decision = Decision(
        at=1_800_000_000.0, replicas_from=1, replicas_to=3, metric="in_flight", observed=11.0,
        target=4.0, reporting=1, recommended=3, reason="in-flight requests per instance 11",
    )  # fmt: skip
    Deployment.objects.filter(pk=deployment.pk).update(
        scaling=ScalingState(cold_start_seconds=42.0, decisions=(decision,))
    )
    page = admin_client.get(
        reverse("admin:deployments_deployment_change", args=[deployment.pk])
    ).content.decode()
    assert "1-4 replicas on in-flight requests per instance 4" in page
    assert "Last cold start: 42.0 s." in page
    assert "2027-01-15 08:00:00 UTC: 1 → 3 (in-flight requests per instance 11)" in page
    assert "Max replicas" in page and "Scale to zero after seconds" in page
    assert '"recommendations"' not in page  # the stored JSON is not shown raw
    listing = admin_client.get(reverse("admin:deployments_deployment_changelist"))
    assert "1-4 replicas on in-flight" in listing.content.decode()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_autoscale_shows_its_fields_in_a_browser(
    live_server,
    member,
    team,
    model,
    version,
    cpu_instance_type,
    browser_page,  # noqa: F811
):
    """static/web/scaling_form.js only shows and hides; the server decides from the checkbox."""
    from playwright.sync_api import expect

    page = browser_page
    page.goto(live_server.url + "/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-mia")
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Search").wait_for()
    page.goto(live_server.url + reverse("web:deploy", args=[team.slug, model.slug]))

    replicas = page.get_by_label("Replicas", exact=True)
    expect(replicas).to_be_visible()
    page.get_by_test_id("scaling").locator("summary").click()
    expect(page.get_by_test_id("autoscale-fields")).to_be_hidden()
    page.get_by_label("Autoscale").check()
    expect(page.get_by_test_id("autoscale-fields")).to_be_visible()
    expect(replicas).to_be_hidden()
    page.get_by_label("Minimum instances").fill("1")
    page.get_by_label("Maximum instances").fill("3")
    page.get_by_label("Scale to zero after (s)").fill("600")
    page.get_by_role("button", name="Deploy").click()
    page.wait_for_url("**/deployments/*/")
    deployment = Deployment.objects.get()
    assert policy_of(deployment) == (1, 1, 3, "in_flight", 4.0, 10, 300, 600)
