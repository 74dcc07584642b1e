"""The deploy form's cost estimate follows the replicas and the instance type in a real browser
(Debian's chromium driven by Playwright): static/web/cost_estimate.js."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from portal.deployments.models import InstanceType
from tests.web.test_browser import browser_page  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_estimate_follows_replicas_and_type(
    live_server,
    member,
    team,
    model,
    version,
    cpu_instance_type,
    browser_page,  # noqa: F811
):
    cpu_instance_type.price_per_hour = Decimal("0.0500")
    cpu_instance_type.save()
    # Made here, not read from migration 0008's seed: a transactional test before this one
    # may have flushed the seeded rows.
    InstanceType.objects.update_or_create(
        name="gpu-a10g-1",
        defaults={"gpus": 1, "accelerator": "nvidia-a10g", "price_per_hour": Decimal("1.2120")},
    )
    from playwright.sync_api import expect

    page = browser_page
    page.goto(live_server.url + "/")
    page.get_by_label("Username").fill("mia")
    page.get_by_label("Password").fill("pw-mia")
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Search").wait_for()
    page.goto(live_server.url + reverse("web:deploy", args=[team.slug, model.slug]))

    estimate = page.get_by_test_id("cost-estimate")
    expect(estimate).to_have_text("≈ $0.05/hour · $36.50/month for 1 instance")

    page.get_by_label("Replicas").fill("3")
    expect(estimate).to_have_text("≈ $0.15/hour · $109.50/month for 3 instances")

    # The GPU type's price (migration 0008's example), computed in the page as the
    # server computes it: 3 times $1.2120 = $3.636 an hour.
    gpu = page.locator("#id_instance_type option", has_text="gpu-a10g-1")
    page.get_by_label("Instance type").select_option(gpu.get_attribute("value"))
    expect(estimate).to_have_text("≈ $3.64/hour · $2,654.28/month for 3 instances")

    page.get_by_label("Replicas").fill("")
    expect(estimate).to_have_text("")
