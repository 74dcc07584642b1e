from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "portal.api"
    label = "api"
    verbose_name = "REST API"
