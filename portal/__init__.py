"""The portal: a Django project whose apps register, package, materialize and roll out models.

The Celery app is imported here so that ``@shared_task`` binds to it in every process.
"""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
