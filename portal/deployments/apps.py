from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "portal.deployments"
    label = "deployments"
    verbose_name = "Deployments"

    def ready(self) -> None:
        """Deployments waiting for a version look again when it becomes ready or fails, and
        the versions they serve (or may roll back to) are never evicted from the cache. Teams
        saved (their rate limits, in the admin), caller keys and models deleted publish the caller keys
        again (:mod:`~portal.deployments.traffic.caller_keys`)."""
        from django.db.models.signals import post_delete, post_save, pre_delete

        from portal.accounts.models import CallerKey, Team
        from portal.cache.services import count_as_in_use
        from portal.deployments.services import versions_in_use
        from portal.deployments.tasks import wake_deployments_of
        from portal.deployments.traffic.caller_keys import key_deleted, model_deleted, team_saved
        from portal.registry.lifecycle import when_version_enters
        from portal.registry.models import Model, VersionState

        when_version_enters(VersionState.READY, wake_deployments_of)
        when_version_enters(VersionState.FAILED, wake_deployments_of)
        count_as_in_use(versions_in_use)
        post_save.connect(team_saved, sender=Team, dispatch_uid="caller_keys.team_saved")
        pre_delete.connect(model_deleted, sender=Model, dispatch_uid="caller_keys.model_deleted")
        post_delete.connect(key_deleted, sender=CallerKey, dispatch_uid="caller_keys.key_deleted")
