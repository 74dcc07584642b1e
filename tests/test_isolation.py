"""What each pytest-xdist worker is given of its own (tests/isolation.py), and the grouping that
keeps the whole-platform tests on one worker: checked from inside the run they isolate."""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from tests import isolation


def test_each_worker_has_its_own_redis_databases_and_var_directory():
    index = isolation.worker_index()
    tests_db, spare_db = 15 - 2 * index, 14 - 2 * index
    assert settings.REDIS_URL.endswith(f"/{tests_db}")
    assert settings.CELERY_BROKER_URL.endswith(f"/{tests_db}")
    assert isolation.spare_redis_url().endswith(f"/{spare_db}")
    assert str(settings.VAR_DIR).endswith(f"-{isolation.worker_name()}")
    # The processes tests start read the platform's settings, from this worker's environment.
    assert os.environ["DJANGO_SETTINGS_MODULE"] == "portal.settings"
    assert os.environ["REDIS_URL"] == settings.REDIS_URL


def test_a_worker_index_past_redis_databases_is_refused():
    with pytest.raises(RuntimeError, match="16 databases"):
        isolation._databases(7)


@pytest.mark.xdist_group("platform")
def test_grouped_tests_carry_their_group_under_loadgroup(request, pytestconfig):
    """pytest-xdist's loadgroup keeps a group on one worker by suffixing its tests' ids; pytest
    9.2 stopped reading the attribute it writes (pyproject.toml pins below it). Were that to
    happen again, the whole-platform tests would quietly run two at once."""
    if not pytestconfig.getvalue("loadgroup"):
        pytest.skip("not an xdist run with --dist loadgroup")
    assert request.node.nodeid.endswith("@platform")
