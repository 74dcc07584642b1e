from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "portal.deployments"
    label = "deployments"
    verbose_name = "Deployments"
