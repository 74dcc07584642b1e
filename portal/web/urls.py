from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import path

from portal.web.views import caller_keys, deployments, multi_region, playground, registry, tokens

app_name = "web"

team = "t/<slug:team>/"
model = team + "models/<slug:model>/"

urlpatterns = [
    path("", registry.home, name="home"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="web/login.html",
            redirect_authenticated_user=True,
            # The local default's credentials are hinted at only where they exist.
            extra_context={"local_default": settings.DEBUG},
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(team, registry.dashboard, name="dashboard"),
    path(team + "models/new/", registry.model_new, name="model_new"),
    path(model, registry.model_detail, name="model_detail"),
    path(model + "metrics/", deployments.model_metrics, name="model_metrics"),
    path(model + "versions/new/", registry.version_new, name="version_new"),
    path(model + "v<int:number>/", registry.version_detail, name="version_detail"),
    path(model + "v<int:number>/live/", registry.version_live, name="version_live"),
    path(model + "v<int:number>/retry/", registry.version_retry, name="version_retry"),
    path(model + "deploy/", deployments.deploy, name="deploy"),
    path(
        team + "deployments/multi/<int:pk>/",
        multi_region.multi_region_detail,
        name="multi_region_detail",
    ),
    path(
        team + "deployments/multi/<int:pk>/<str:action>/",
        multi_region.multi_region_act,
        name="multi_region_act",
    ),
    path(team + "deployments/<int:pk>/", deployments.deployment_detail, name="deployment_detail"),
    path(team + "deployments/<int:pk>/live/", deployments.deployment_live, name="deployment_live"),
    path(
        team + "deployments/<int:pk>/metrics/",
        deployments.deployment_metrics,
        name="deployment_metrics",
    ),
    path(
        team + "deployments/<int:pk>/playground/key/",
        playground.playground_key,
        name="playground_key",
    ),
    path(
        team + "deployments/<int:pk>/playground/send/",
        playground.playground_send,
        name="playground_send",
    ),
    path(
        team + "deployments/<int:pk>/<str:action>/",
        deployments.deployment_act,
        name="deployment_act",
    ),
    path(team + "tokens/", tokens.tokens, name="tokens"),
    path(team + "tokens/<int:pk>/revoke/", tokens.token_revoke, name="token_revoke"),
    path(team + "keys/", caller_keys.caller_keys, name="caller_keys"),
    path(team + "keys/<int:pk>/revoke/", caller_keys.caller_key_revoke, name="caller_key_revoke"),
]
