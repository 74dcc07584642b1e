"""The OpenAPI schema is valid and warning-free, and the docs page needs no external CDN."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from openapi_spec_validator import validate

pytestmark = pytest.mark.django_db

EXPECTED_PATHS = {
    "/api/v1/teams/": {"get"},
    "/api/v1/teams/{slug}/": {"get"},
    "/api/v1/releases/": {"get"},
    "/api/v1/releases/{id}/": {"get"},
    "/api/v1/instance-types/": {"get"},
    "/api/v1/instance-types/{name}/": {"get"},
    "/api/v1/models/": {"get", "post"},
    "/api/v1/models/{id}/": {"get", "patch"},
    "/api/v1/models/{id}/metrics/": {"get"},
    "/api/v1/versions/": {"get", "post"},
    "/api/v1/versions/{id}/": {"get", "patch"},
    "/api/v1/versions/{id}/events/": {"get"},
    "/api/v1/versions/{id}/retry/": {"post"},
    "/api/v1/deployments/": {"get", "post"},
    "/api/v1/deployments/{id}/": {"get", "patch"},
    "/api/v1/deployments/advice/": {"get"},
    "/api/v1/deployments/{id}/metrics/": {"get"},
    **{
        f"/api/v1/deployments/{{id}}/{action}/": {"post"}
        for action in ("pause", "resume", "abort", "promote", "rollback")
    },
    "/api/v1/events/": {"get"},
    "/api/v1/events/{id}/": {"get"},
    "/api/v1/instances/": {"get"},
    "/api/v1/instances/{id}/": {"get"},
}
HTTP_METHODS = {"get", "put", "post", "patch", "delete", "head", "options", "trace"}


@pytest.fixture
def schema(api, member) -> dict:
    response = api(member).get("/api/schema/?format=json")
    assert response.status_code == 200, response.content
    return response.json()


def test_served_schema_is_valid_openapi(schema):
    validate(schema)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "LLM serving platform API"


def test_schema_documents_every_endpoint(schema):
    documented = {
        path: {method for method in item if method in HTTP_METHODS}
        for path, item in schema["paths"].items()
    }
    assert documented == EXPECTED_PATHS


def test_schema_documents_bearer_tokens(schema):
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A team API token (mlp_...).",
    }
    create = schema["paths"]["/api/v1/models/"]["post"]
    assert {"bearerAuth": []} in create["security"]


def test_schema_uses_the_input_serializers(schema):
    def request_ref(path: str, method: str) -> str:
        body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]
        return body["schema"]["$ref"].rsplit("/", 1)[-1]

    assert request_ref("/api/v1/models/", "post") == "ModelCreateInRequest"
    assert request_ref("/api/v1/versions/{id}/", "patch") == "PatchedVersionUpdateInRequest"
    assert request_ref("/api/v1/deployments/{id}/pause/", "post") == "ActionInRequest"
    created = schema["paths"]["/api/v1/deployments/"]["post"]["responses"]
    assert created["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/DeploymentOut"
    )


def test_generation_emits_no_warnings_or_errors():
    GENERATOR_STATS.reset()
    generated = SchemaGenerator().get_schema(request=None, public=True)
    assert not GENERATOR_STATS._warn_cache, dict(GENERATOR_STATS._warn_cache)
    assert not GENERATOR_STATS._error_cache, dict(GENERATOR_STATS._error_cache)
    validate(generated)


def test_management_command_passes_with_fail_on_warn(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    assert "/api/v1/deployments/{id}/rollback/" in target.read_text()


def test_docs_render_with_local_assets_only(api, member):
    response = api(member).get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html.lower()
    assert not re.search(r"cdn|jsdelivr|unpkg|cdnjs|googleapis", html, re.IGNORECASE)
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert assets, html
    for asset in assets:
        assert asset.startswith("/static/drf_spectacular_sidecar/"), asset
        assert finders.find(asset.removeprefix("/static/")), f"{asset} is not a local static file"
    assert "/api/schema/" in html
