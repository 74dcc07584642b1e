from django.apps import AppConfig


class CacheConfig(AppConfig):
    name = "portal.cache"
    label = "cache"
    verbose_name = "Model cache"
