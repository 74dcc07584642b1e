"""The portal's own ``/metrics``: its requests, its Celery queue, and its tasks' durations as
recorded by a real worker process; and the scrape task's lock."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from portal.core.tasks import beat_heartbeat
from portal.metrics import tasks

pytestmark = pytest.mark.django_db


def families(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def samples(family, **labels) -> list:
    return [s for s in family.samples if labels.items() <= s.labels.items()]


def test_requests_are_counted_by_view_name_not_path(api, member, deployment, clean_redis):
    client = api(member)
    assert client.get(f"/api/v1/deployments/{deployment.pk}/").status_code == 200
    assert client.get("/api/v1/deployments/999999/").status_code == 404
    anonymous = api()
    found = families(anonymous)
    requests = found["portal_http_requests"]
    assert samples(requests, method="GET", view="deployment-detail", status="200")
    assert samples(requests, method="GET", view="deployment-detail", status="404")
    assert samples(found["portal_http_request_duration_seconds"], view="deployment-detail")
    # In no label value (the sample values are random durations, which may hold "999999").
    labels = {v for f in families(anonymous).values() for s in f.samples for v in s.labels.values()}
    for team_data in (deployment.model.team.slug, deployment.model.slug, "999999"):
        assert not [value for value in labels if team_data in value]


def test_queue_depth_is_read_from_the_broker(api, clean_redis):
    before = families(api())["portal_celery_queue_length"]
    assert [s.value for s in samples(before, queue=settings.CELERY_TASK_DEFAULT_QUEUE)] == [0.0]
    beat_heartbeat.apply_async()  # no worker here: it waits in the queue
    beat_heartbeat.apply_async()
    after = families(api())["portal_celery_queue_length"]
    assert [s.value for s in samples(after, queue=settings.CELERY_TASK_DEFAULT_QUEUE)] == [2.0]
    assert [s.value for s in families(api())["portal_metrics_redis_up"].samples] == [1.0]


def test_a_workers_task_durations_reach_the_web_process(api, celery_worker_process):
    for _ in range(3):
        beat_heartbeat.delay().get(timeout=30)
    family = families(api())["portal_celery_task_duration_seconds"]
    labels = {"task": "portal.core.tasks.beat_heartbeat", "outcome": "success"}
    [count] = [s.value for s in samples(family, **labels) if s.name.endswith("_count")]
    assert count == 3
    buckets = [s for s in samples(family, **labels) if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 3
    assert [s.value for s in buckets] == sorted(s.value for s in buckets)


def test_the_scrape_task_skips_while_another_pass_holds_the_lock(clean_redis):
    held = redis.Redis.from_url(settings.REDIS_URL).lock(tasks.LOCK_KEY, timeout=30)
    assert held.acquire(blocking=False)
    try:
        assert tasks.scrape_metrics() is None
    finally:
        held.release()
    report = tasks.scrape_metrics()
    assert report is not None and report["scraped"] == 0
