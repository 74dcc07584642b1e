from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from portal.core import views as core_views
from portal.metrics import views as metrics_views

handler400 = "portal.api.errors.bad_request"
handler404 = "portal.api.errors.not_found"

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    # Browsers ask for /favicon.ico whatever the page says.
    path("favicon.ico", RedirectView.as_view(url=static("web/favicon.svg"), permanent=True)),
    path("livez", core_views.livez, name="livez"),
    path("metrics", metrics_views.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("portal.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("portal.web.urls")),
]
