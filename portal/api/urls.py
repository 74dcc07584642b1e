from django.urls import include, path
from rest_framework.routers import DefaultRouter

from portal.api import views

router = DefaultRouter()
router.register("teams", views.TeamViewSet, basename="team")
router.register("releases", views.ReleaseViewSet, basename="release")
router.register("regions", views.RegionViewSet, basename="region")
router.register("instance-types", views.InstanceTypeViewSet, basename="instance-type")
router.register("models", views.RegisteredModelViewSet, basename="model")
router.register("plugins", views.PluginWheelViewSet, basename="plugin")
router.register("versions", views.VersionViewSet, basename="version")
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register(
    "multi-region-deployments",
    views.MultiRegionDeploymentViewSet,
    basename="multi-region-deployment",
)
router.register("events", views.EventViewSet, basename="event")
router.register("instances", views.InstanceViewSet, basename="instance")
router.register("caller-keys", views.CallerKeyViewSet, basename="caller-key")

urlpatterns = [path("", include(router.urls))]
