from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "portal.metrics"
    label = "metrics"
    verbose_name = "Metrics"

    def ready(self) -> None:
        # Workers are other processes than the web server that exposes /metrics: their task
        # timings go through Redis, recorded by these signal handlers wherever tasks run.
        from portal.metrics import own

        own.connect_task_signals()
