"""Stop every serving process the local launcher started (``./dev run`` runs it on exit).

Instances run in their own sessions so that a worker's death does not take them down; this is
how a whole local platform stops them. Deployments are left as they are: on the next run the
controller finds their instances gone and starts new ones.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from portal.deployments.models import Region
from portal.deployments.runtime.launchers import region_config
from portal.deployments.runtime.launchers.local import LocalLauncher


class Command(BaseCommand):
    help = "Stop every local serving instance, in every region's run directory (they drain first)."

    def handle(self, *args, **options):
        configs = {config.run_root: config for config in [region_config(None)]}
        for region in Region.objects.all():
            if (region.launcher or settings.INSTANCE_LAUNCHER) == "local":
                config = region_config(region)
                configs.setdefault(config.run_root, config)
        stopped = []
        for config in configs.values():
            stopped += LocalLauncher(config).stop_all(settings.INSTANCE_DRAIN_SECONDS)
        self.stdout.write(f"Stopped {len(stopped)} local instance(s).")
