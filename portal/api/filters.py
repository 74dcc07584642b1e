import django_filters
import django_filters.rest_framework
from django import forms

from portal.deployments.models import Deployment, DeploymentEvent, Instance
from portal.registry.models import Model, ModelVersion, PlatformRelease


class IntegerFilter(django_filters.NumberFilter):
    """A whole number (django-filter's NumberFilter reads decimals: ``number=0.5``)."""

    field_class = forms.IntegerField


class StrictFilterSet(django_filters.rest_framework.FilterSet):
    """A filter given a value it cannot read (empty, ``null`` or ``2`` for a boolean, which
    takes ``true`` or ``false``) is a 400 naming it, not silently no filter: a caller who filters
    wants the filter applied."""

    def is_valid(self) -> bool:
        valid = super().is_valid()
        for name in self.filters:
            unread = name in self.data and self.form.cleaned_data.get(name) in (None, "")
            if unread and name not in self.form.errors:
                self.form.add_error(name, "Give a value this filter reads, or leave it out.")
        return valid and not self.form.errors


class ModelFilter(StrictFilterSet):
    team = django_filters.CharFilter(field_name="team__slug")

    class Meta:
        model = Model
        fields = ["team", "slug", "task"]


class VersionFilter(StrictFilterSet):
    number = IntegerFilter()

    class Meta:
        model = ModelVersion
        fields = ["model", "number", "state", "backend"]


class DeploymentFilter(StrictFilterSet):
    class Meta:
        model = Deployment
        fields = ["model", "strategy", "observed_state", "desired_state"]


class EventFilter(StrictFilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gt")
    after_id = IntegerFilter(field_name="id", lookup_expr="gt")

    class Meta:
        model = DeploymentEvent
        fields = ["deployment", "kind", "since", "after_id"]


class InstanceFilter(StrictFilterSet):
    class Meta:
        model = Instance
        fields = ["deployment", "state", "launcher"]


class ReleaseFilter(StrictFilterSet):
    class Meta:
        model = PlatformRelease
        fields = ["is_default"]
