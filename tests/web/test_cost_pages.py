"""Prices and cost estimates on the deploy form and the deployment page, and in the API."""

from __future__ import annotations

import html
import re
from decimal import Decimal

import pytest
from django.urls import reverse

from portal.deployments.models import Instance, InstanceState, InstanceType
from tests.factories import make_version
from tests.web.test_pages import page_html

pytestmark = pytest.mark.django_db

#: The multiplication sign the spec lines and the page write.
X = "\u00d7"


@pytest.fixture
def priced(cpu_instance_type):
    cpu_instance_type.price_per_hour = Decimal("0.0500")
    cpu_instance_type.save()
    return cpu_instance_type


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def _estimate(page: str) -> str:
    found = re.search(r'<p [^>]*data-testid="cost-estimate"[^>]*>(.*?)</p>', page, re.S)
    assert found, page
    return _text(found.group(1))


def test_deploy_form_lists_each_type_with_its_spec_and_price(member, team, model, version, priced):
    page = page_html(member, "web:deploy", team.slug, model.slug)
    options = {
        _text(label): attrs
        for attrs, label in re.findall(
            r"<option ([^>]*)>(.*?)</option>",
            page.split('name="instance_type"')[1].split("</select>")[0],
        )
    }
    cpu = next(label for label in options if label.startswith("cpu-local"))
    assert cpu == f"cpu-local: {priced.spec_line} · $0.05/hour"
    assert 'data-price="0.0500"' in options[cpu]
    gpu = next(label for label in options if label.startswith("gpu-a10g-1"))
    assert gpu == f"gpu-a10g-1: 1 {X} nvidia-a10g · 8 vCPU · 32 GiB · $1.21/hour"

    # The estimate for the initial choice (one replica of the first type), and the script
    # that keeps it up to date, served from the portal's own static files.
    assert _estimate(page) == "≈ $0.05/hour · $36.50/month for 1 instance"
    assert "web/cost_estimate.js" in page


def test_deploy_form_without_a_price_says_so(member, team, model, version, cpu_instance_type):
    InstanceType.objects.exclude(pk=cpu_instance_type.pk).update(is_active=False)
    page = page_html(member, "web:deploy", team.slug, model.slug)
    assert "cpu-local: CPU" in page and "· no price set for this type</option>" in page
    assert _estimate(page) == "no price set for this type"


def test_a_refused_post_estimates_what_was_posted(member, team, model, version, priced):
    from tests.web.test_pages import signed_in

    gpu = InstanceType.objects.get(name="gpu-a10g-1")
    response = signed_in(member).post(
        reverse("web:deploy", args=[team.slug, model.slug]),
        {"version": version.pk, "strategy": "red_black", "replicas": 3,
         "instance_type": gpu.pk, "stages": "not numbers"},
    )  # fmt: skip
    assert response.status_code == 200
    assert _estimate(response.content.decode()) == (
        "≈ $3.64/hour · $2,654.28/month for 3 instances"
    )


def test_deployment_page_shows_the_type_and_what_runs_now(
    member, team, deployment, priced, artifact_root
):
    v2 = make_version(deployment.model, artifact_root)
    for name, version in (("a", deployment.target_version), ("b", v2)):
        Instance.objects.create(
            deployment=deployment, version=version, name=name, state=InstanceState.READY
        )
    page = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    line = re.search(r'data-testid="deployment-cost">(.*?)</p>', page, re.S)
    assert line, page
    assert _text(line.group(1)) == (
        f"1 {X} cpu-local (CPU · 2 vCPU · 4 GiB) · ≈ $0.10/hour · $73.00/month for 2 instances"
    )


def test_deployment_page_without_a_price(member, team, deployment):
    page = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    assert "no price set for this type" in page


def test_api_gives_prices_specs_and_the_deployment_estimate(api, member, deployment, priced):
    client = api(member)
    types = {t["name"]: t for t in client.get("/api/v1/instance-types/").json()["results"]}
    assert types["cpu-local"]["price_per_hour"] == "0.0500"
    assert types["cpu-local"]["spec"] == "CPU · 2 vCPU · 4 GiB"
    assert types["gpu-a10g-1"]["price_per_hour"] == "1.2120"
    body = client.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert body["estimated_cost_per_hour"] == "0.0500"

    InstanceType.objects.filter(pk=priced.pk).update(price_per_hour=None)
    assert client.get("/api/v1/instance-types/cpu-local/").json()["price_per_hour"] is None
    body = client.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert body["estimated_cost_per_hour"] is None
