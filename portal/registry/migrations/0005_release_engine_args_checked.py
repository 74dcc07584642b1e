"""Drop the engine arguments vLLM 0.24.0 lacks from the seeded release's allow-list.

``swap_space`` was allowed, but vLLM 0.24.0's ``AsyncEngineArgs`` has no such field, so
Triton's vLLM backend would fail to load every model that set it. The names are written out
(not read from portal.registry.engine_args) so this migration keeps meaning what it meant.
"""

from django.db import migrations

RELEASE = "triton-26.07"
#: In 0002's allow-list, absent from vLLM 0.24.0's AsyncEngineArgs.
DROPPED = ("swap_space",)


def drop(apps, schema_editor):
    PlatformRelease = apps.get_model("registry", "PlatformRelease")
    for release in PlatformRelease.objects.filter(name=RELEASE, vllm_version="0.24.0"):
        kept = [name for name in release.allowed_engine_args if name not in DROPPED]
        if kept != release.allowed_engine_args:
            release.allowed_engine_args = kept
            release.save(update_fields=["allowed_engine_args"])


class Migration(migrations.Migration):
    dependencies = [("registry", "0004_version_events")]
    # Not reversible into a broken allow-list: going back leaves the checked one in place.
    operations = [migrations.RunPython(drop, migrations.RunPython.noop)]
