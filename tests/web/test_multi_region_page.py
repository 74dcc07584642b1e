"""The multi-region deployment page: the waves, one row per region in wave order, the merged
timeline tagged by region, its actions, and the regional deployment pages that point to it.
Each region's launcher is moved by hand, as in tests/deployments/test_waves.py."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from django.urls import reverse

from portal.core.actors import Actor
from portal.deployments.models import MultiRegionDeployment, Region
from portal.deployments.regions import multi_region
from portal.deployments.regions.multi_region import RegionPart
from tests.deployments.memory_launcher import MemoryLauncher
from tests.deployments.test_controller import ready_version
from tests.deployments.test_waves import NAMES, World
from tests.factories import make_model
from tests.web.test_pages import page_html, signed_in

pytestmark = pytest.mark.django_db

USER = Actor(label="user:test")


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    MemoryLauncher.reset()
    yield
    MemoryLauncher.reset()


@pytest.fixture
def world(team, release, artifact_root, cpu_instance_type) -> World:
    """v1 serving in us-east then eu-west; v2 rolled out, its first wave done and baking."""
    regions = [Region.objects.create(name=name) for name in NAMES[:2]]
    model = make_model(team, "chat")
    v1, v2 = ready_version(model, artifact_root), ready_version(model, artifact_root)
    group = multi_region.create(
        model=model,
        version=v1,
        regions=[RegionPart(region, replicas=1) for region in regions],
        instance_type=cpu_instance_type,
        actor=USER,
        bake_seconds=0,
        wave_bake_seconds=0,
    )
    world = World(group)
    world.run_until(lambda g: g.observed_state == "serving")
    MultiRegionDeployment.objects.filter(pk=group.pk).update(wave_bake_seconds=600)
    group.refresh_from_db()
    multi_region.roll_out(group, v2, actor=USER)
    world.run_until(lambda g: g.wave_phase == "bake")
    return world


def text(html: str) -> str:
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def detail(world: World) -> tuple[str, list]:
    group = world.group
    return "web:multi_region_detail", [group.model.team.slug, group.pk]


def test_the_page_shows_each_region_and_the_merged_timeline(member, world):
    view, args = detail(world)
    html = page_html(member, view, *args)
    assert re.findall(r'data-testid="region-row" data-region="([^"]+)"', html) == [
        "us-east",
        "eu-west",
    ]
    words = text(html)
    assert "Wave 1 of 2: baking before the next wave." in words
    assert re.search(r"Bake ends in (9|10) min \d+ s: then wave 2 \(eu-west\)", words), words
    assert "v2 (from v1)" in words
    assert world.group.status_message in words
    # Each region's traffic bar, its instances and a link to its deployment.
    bars = re.findall(r'data-testid="traffic".*?</div>\s*</div>', html, re.S)
    assert len(bars) == 2
    assert 'data-version="2" data-percent="100"' in bars[0]
    assert 'data-version="1" data-percent="100"' in bars[1]
    assert words.count("1 of 1 instance ready") == 2
    for deployment in world.regional:
        url = reverse("web:deployment_detail", args=[args[0], deployment.pk])
        assert f'href="{url}"' in html
    # The timeline: every region's events, newest first, each tagged with its region.
    timeline = html.split('data-testid="timeline"')[1]
    tags = re.findall(r'<li data-region="([^"]+)">', timeline)
    assert set(tags) == {"us-east", "eu-west"}
    assert len(tags) == sum(d.events.count() for d in world.regional)
    pills = re.findall(r'data-testid="event-region">([^<]+)<', timeline)
    assert pills == tags
    times = re.findall(r'<time datetime="([^"]+)"', timeline)
    assert times == sorted(times, reverse=True)
    assert "us-east serves v2" in text(timeline)
    # A member may pause, promote, abort or roll back a rollout in progress.
    actions = html.split('data-testid="actions"')[1].split("</div>")[0]
    forms = re.findall(
        r'<form method="post" action="([^"]+)">\s*<input[^>]*csrfmiddlewaretoken', actions
    )
    assert {f.rstrip("/").rsplit("/", 1)[1] for f in forms} == {
        "pause",
        "promote",
        "abort",
        "rollback",
    }


def test_a_viewer_sees_no_actions_and_another_team_nothing(viewer, outsider, world):
    view, args = detail(world)
    html = page_html(viewer, view, *args)
    assert 'data-testid="region-row"' in html and 'data-testid="actions"' not in html
    assert signed_in(outsider).get(reverse(view, args=args)).status_code == 404
    act = reverse("web:multi_region_act", args=[*args, "pause"])
    assert signed_in(viewer).post(act).status_code == 403
    assert signed_in(outsider).post(act).status_code == 404


def test_actions_are_posted_to_the_whole_rollout(member, world):
    view, args = detail(world)
    client = signed_in(member)
    response = client.post(reverse("web:multi_region_act", args=[*args, "pause"]))
    assert response.status_code == 302 and response["Location"] == reverse(view, args=args)
    world.group.refresh_from_db()
    assert world.group.desired_state == "paused"
    world.step()
    assert world.group.observed_state == "paused"
    html = client.get(reverse(view, args=args)).content.decode()
    assert "Pause requested; every region concerned follows." in text(html)
    assert "asked: paused" in text(html)
    assert "multi-region-deployments" not in html  # no API link needed: forms post here
    # Refused actions say why, and change nothing.
    response = client.post(reverse("web:multi_region_act", args=[*args, "pause"]), follow=True)
    assert "Cannot pause this multi-region deployment" in text(response.content.decode())
    assert client.post(reverse("web:multi_region_act", args=[*args, "explode"])).status_code == 404
    client.post(reverse("web:multi_region_act", args=[*args, "resume"]))
    world.group.refresh_from_db()
    assert world.group.desired_state == "active"


def test_a_regional_deployment_page_points_to_its_multi_region_deployment(member, world):
    slug, pk = detail(world)[1]
    second = world.regional[1]
    html = page_html(member, "web:deployment_detail", slug, second.pk)
    words = text(html)
    assert f"Region eu-west, wave 2 of 2 of multi-region deployment #{pk}" in words
    assert f'href="{reverse("web:multi_region_detail", args=[slug, pk])}"' in html
    # Its own actions are the whole rollout's: none here.
    assert reverse("web:deployment_act", args=[slug, second.pk, "pause"]) not in html
    assert 'class="buttons actions"' not in html


def test_the_model_page_lists_the_multi_region_deployment_and_each_regions_part(member, world):
    slug, pk = detail(world)[1]
    html = page_html(member, "web:model_detail", slug, world.group.model.slug)
    assert f'href="{reverse("web:multi_region_detail", args=[slug, pk])}"' in html
    words = text(html)
    assert f"Multi-region #{pk} · v2" in words
    assert "in us-east" in words and "in eu-west" in words
