"""The small things a new user meets in the first minutes: the tab's icon, times that read as
words, and the dashboard's counts."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from portal.cache.models import CopyState, Materialization
from portal.web.templatetags.portal_web import ago
from tests.web.test_pages import page_html


def test_favicon_ico_leads_to_the_icon(client: Client):
    answer = client.get("/favicon.ico")
    assert answer.status_code == 301
    assert answer["Location"].endswith("/web/favicon.svg")
    found = finders.find("web/favicon.svg")
    assert found is not None and Path(found).read_text().startswith("<svg")


def test_times_under_a_minute_read_just_now():
    now = timezone.now()
    assert ago(now) == "just now"
    assert ago(now - timedelta(seconds=59)) == "just now"
    assert ago(now - timedelta(minutes=3, seconds=5)) == "3\xa0minutes ago"
    assert ago(None) == "—"


@pytest.mark.django_db
def test_a_new_version_page_says_just_now(member, team, model, version):
    page = page_html(member, "web:version_detail", team.slug, model.slug, version.number)
    assert "changed just now" in page and "0\xa0minutes" not in page and "0 minutes" not in page


@pytest.mark.django_db
def test_the_copy_rate_says_what_it_waits_for_instead_of_a_dash(member, team, model, version):
    copy = Materialization.objects.create(
        version=version, tree="t", state=CopyState.COPYING, through="FSx file system fs-1"
    )
    page = page_html(member, "web:version_detail", team.slug, model.slug, version.number)
    assert "measuring…" in page and "estimating…" in page
    assert 'data-testid="copy-through">FSx file system fs-1</dd>' in page
    copy.state = CopyState.PRESENT
    copy.save()
    page = page_html(member, "web:version_detail", team.slug, model.slug, version.number)
    assert 'data-testid="copy-rate"' not in page  # a finished copy has no rate to show


@pytest.mark.django_db
def test_the_model_page_shows_each_live_deployments_endpoint(member, team, model, deployment):
    page = page_html(member, "web:model_detail", team.slug, model.slug)
    assert (
        'data-testid="model-endpoint" data-copy="the endpoint">http://127.0.0.1:8080/models/search/ranker</code>'
        in page
    )
