from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "portal.deployments"
    label = "deployments"
    verbose_name = "Deployments"

    def ready(self) -> None:
        """Deployments waiting for a version look again when it becomes ready or fails, and
        the versions they serve (or may roll back to) are never evicted from the cache."""
        from portal.cache.services import count_as_in_use
        from portal.deployments.services import versions_in_use
        from portal.deployments.tasks import wake_deployments_of
        from portal.registry.lifecycle import when_version_enters
        from portal.registry.models import VersionState

        when_version_enters(VersionState.READY, wake_deployments_of)
        when_version_enters(VersionState.FAILED, wake_deployments_of)
        count_as_in_use(versions_in_use)
