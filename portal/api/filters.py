import django_filters

from portal.deployments.models import Deployment, DeploymentEvent, Instance
from portal.registry.models import Model, ModelVersion


class ModelFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug")

    class Meta:
        model = Model
        fields = ["team", "slug", "task"]


class VersionFilter(django_filters.FilterSet):
    class Meta:
        model = ModelVersion
        fields = ["model", "number", "state", "backend"]


class DeploymentFilter(django_filters.FilterSet):
    class Meta:
        model = Deployment
        fields = ["model", "strategy", "observed_state", "desired_state"]


class EventFilter(django_filters.FilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gt")
    after_id = django_filters.NumberFilter(field_name="id", lookup_expr="gt")

    class Meta:
        model = DeploymentEvent
        fields = ["deployment", "kind", "since", "after_id"]


class InstanceFilter(django_filters.FilterSet):
    class Meta:
        model = Instance
        fields = ["deployment", "state", "launcher"]
