from django.apps import AppConfig


class CacheConfig(AppConfig):
    name = "portal.cache"
    label = "cache"
    verbose_name = "Model cache"

    def ready(self) -> None:
        """A registered version (new, or sent back by a retry) has its weights copied."""
        from portal.cache.services import request_materialization
        from portal.registry.lifecycle import when_version_enters
        from portal.registry.models import VersionState

        when_version_enters(VersionState.REGISTERED, request_materialization)
