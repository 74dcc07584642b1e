"""The OpenAPI schema is valid and warning-free, and the docs page needs no external CDN."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from openapi_spec_validator import validate

from portal.registry.lifecycle import transition_version
from portal.registry.models import VersionState
from tests.api.helpers import api_error

pytestmark = pytest.mark.django_db

EXPECTED_PATHS = {
    "/api/v1/teams/": {"get"},
    "/api/v1/teams/{slug}/": {"get"},
    "/api/v1/releases/": {"get"},
    "/api/v1/releases/{id}/": {"get"},
    "/api/v1/regions/": {"get"},
    "/api/v1/regions/{name}/": {"get"},
    "/api/v1/instance-types/": {"get"},
    "/api/v1/instance-types/{name}/": {"get"},
    "/api/v1/models/": {"get", "post"},
    "/api/v1/models/{id}/": {"get", "patch"},
    "/api/v1/models/{id}/metrics/": {"get"},
    "/api/v1/plugins/": {"get", "post"},
    "/api/v1/plugins/{id}/": {"get"},
    "/api/v1/versions/": {"get", "post"},
    "/api/v1/versions/{id}/": {"get", "patch"},
    "/api/v1/versions/{id}/events/": {"get"},
    "/api/v1/versions/{id}/retry/": {"post"},
    "/api/v1/deployments/": {"get", "post"},
    "/api/v1/deployments/{id}/": {"get", "patch"},
    "/api/v1/deployments/advice/": {"get"},
    "/api/v1/deployments/{id}/metrics/": {"get"},
    "/api/v1/deployments/{id}/analysis/": {"get"},
    **{
        f"/api/v1/deployments/{{id}}/{action}/": {"post"}
        for action in ("pause", "resume", "abort", "promote", "rollback")
    },
    "/api/v1/multi-region-deployments/": {"get", "post"},
    "/api/v1/multi-region-deployments/{id}/": {"get", "patch"},
    **{
        f"/api/v1/multi-region-deployments/{{id}}/{action}/": {"post"}
        for action in ("pause", "resume", "abort", "promote", "rollback")
    },
    "/api/v1/events/": {"get"},
    "/api/v1/events/{id}/": {"get"},
    "/api/v1/instances/": {"get"},
    "/api/v1/instances/{id}/": {"get"},
    "/api/v1/instances/{id}/logs/": {"get"},
    "/api/v1/caller-keys/": {"get", "post"},
    "/api/v1/caller-keys/{id}/": {"get", "delete"},
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
    # In a URL, not anywhere: the page carries a random token, in which "CDn" was once seen.
    cdn_url = r"""(?:https?:)?//[^\s"'<>]*(?:cdn|jsdelivr|unpkg|googleapis)"""
    assert not re.search(cdn_url, html, re.IGNORECASE)
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert assets, html
    for asset in assets:
        assert asset.startswith("/static/drf_spectacular_sidecar/"), asset
        assert finders.find(asset.removeprefix("/static/")), f"{asset} is not a local static file"
    assert "/api/schema/" in html


# --- The contract: errors, strict bodies, and answers that match --------------------------------

ERROR_REF = "#/components/schemas/ErrorOut"
#: Operations whose service can refuse a well-formed call for the object's state.
CONFLICTS = {
    ("post", "/api/v1/versions/"),
    ("patch", "/api/v1/versions/{id}/"),
    ("post", "/api/v1/versions/{id}/retry/"),
    ("post", "/api/v1/deployments/"),
    ("patch", "/api/v1/deployments/{id}/"),
    *(
        ("post", f"/api/v1/deployments/{{id}}/{action}/")
        for action in ("pause", "resume", "abort", "promote", "rollback")
    ),
    ("post", "/api/v1/multi-region-deployments/"),
    ("patch", "/api/v1/multi-region-deployments/{id}/"),
    *(
        ("post", f"/api/v1/multi-region-deployments/{{id}}/{action}/")
        for action in ("pause", "resume", "abort", "promote", "rollback")
    ),
}


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method, path, operation


def test_every_operation_declares_its_errors_with_the_error_body(schema):
    assert schema["components"]["schemas"]["ErrorOut"]["required"] == ["error"]
    assert schema["components"]["schemas"]["ErrorDetailOut"]["required"] == ["code", "message"]
    for method, path, operation in operations(schema):
        responses = operation["responses"]
        errors = {code for code in responses if code >= "400"}
        expected = {"401"}
        if method != "get":
            expected.add("403")
        if "{" in path or (method == "get" and "page" in str(operation.get("parameters"))):
            expected.add("404")  # no such object, or no such page of a list
        if "requestBody" in operation:
            expected |= {"400", "413"}
        if operation.get("parameters", []) and any(
            p["in"] != "path" for p in operation["parameters"]
        ):
            expected.add("400")
        if (method, path) in CONFLICTS:
            expected.add("409")
        assert expected <= errors, (method, path, errors)
        for code in errors:
            body = responses[code]["content"]["application/json"]["schema"]
            assert body == {"$ref": ERROR_REF}, (method, path, code)
            assert responses[code]["description"], (method, path, code)
    assert "409" not in schema["paths"]["/api/v1/models/"]["post"]["responses"]


def test_creating_calls_declare_the_idempotency_key(schema):
    create = schema["paths"]["/api/v1/deployments/"]["post"]
    header = [p for p in create["parameters"] if p["in"] == "header"]
    assert [p["name"] for p in header] == ["Idempotency-Key"]
    assert {"400", "422"} <= set(create["responses"])


def test_request_bodies_refuse_what_the_serializers_refuse(schema):
    components = schema["components"]["schemas"]
    for method, path, operation in operations(schema):
        if "requestBody" not in operation:
            continue
        content = operation["requestBody"]["content"]
        # JSON everywhere but the plugin wheel upload, which is multipart/form-data.
        media = content.get("application/json") or content["multipart/form-data"]
        ref = media["schema"]["$ref"]
        body = components[ref.rsplit("/", 1)[-1]]
        assert body["additionalProperties"] is False, (method, path)
    for name in ("DeploymentCreateInRequest", "PatchedDeploymentUpdateInRequest"):
        assert components[name]["properties"]["stages"]["minItems"] == 1
    for name in ("VersionCreateInRequest", "PatchedVersionUpdateInRequest"):
        for field in ("engine_args", "io_spec"):
            declared = components[name]["properties"][field]
            assert declared["type"] == "object", (name, field)
            assert not declared.get("nullable"), (name, field)


def test_the_server_refuses_what_the_schema_refuses(api, member_token, version, cpu_instance_type):
    client = api(member_token)
    model = version.model
    for engine_args in (None, [], "dtype=auto"):
        response = client.patch(
            f"/api/v1/versions/{version.pk}/", {"engine_args": engine_args}, format="json"
        )
        assert api_error(response, 400, "invalid")["fields"].keys() == {"engine_args"}
    body = {
        "model": model.pk,
        "strategy": "red_black",
        "version": version.pk,
        "instance_type": cpu_instance_type.name,
    }
    response = client.post("/api/v1/deployments/", {**body, "stages": []}, format="json")
    assert api_error(response, 400, "invalid")["fields"].keys() == {"stages"}
    response = client.post("/api/v1/deployments/", {**body, "replica": 3}, format="json")
    assert api_error(response, 400, "invalid")["fields"].keys() == {"replica"}
    # Values of the wrong JSON type are refused, not converted.
    wrong_types = {"model": str(model.pk), "replicas": 2.0, "allow_io_change": "yes"}
    response = client.post("/api/v1/deployments/", {**body, **wrong_types}, format="json")
    assert api_error(response, 400, "invalid")["fields"] == {
        "model": ["A valid integer is required."],
        "replicas": ["A valid integer is required."],
        "allow_io_change": ["Must be a valid boolean."],
    }
    response = client.patch(f"/api/v1/models/{model.pk}/", {"description": 0}, format="json")
    assert api_error(response, 400, "invalid")["fields"] == {"description": ["Not a valid string."]}
    response = client.post("/api/v1/deployments/", {**body, "stages": ["50", 100]}, format="json")
    assert api_error(response, 400, "invalid")["fields"] == {
        "stages": ["A valid integer is required."]
    }
    for page_size in ("AAA", "0.5", "0", "true"):
        response = client.get(f"/api/v1/teams/?page_size={page_size}")
        assert api_error(response, 400, "invalid")["fields"].keys() == {"page_size"}
    assert client.get("/api/v1/teams/?page_size=500").status_code == 200  # capped at 200
    response = client.patch(
        f"/api/v1/models/{model.pk}/", {"description": "\r" * 5001}, format="json"
    )
    assert api_error(response, 400, "invalid")["fields"] == {
        "description": ["Ensure this field has no more than 5000 characters."]
    }
    queries = ("versions/?number=0.5", "events/?since=", "releases/?is_default=2")
    for query in (*queries, "releases/?is_default=null"):
        response = client.get(f"/api/v1/{query}")
        field = query.split("?")[1].split("=")[0]
        assert api_error(response, 400, "invalid")["fields"].keys() == {field}, query


def test_version_events_answer_the_declared_plain_list(schema, api, member_token, version):
    declared = schema["paths"]["/api/v1/versions/{id}/events/"]["get"]
    assert [p["name"] for p in declared["parameters"]] == ["id"]
    ok_schema = declared["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok_schema == {"type": "array", "items": {"$ref": "#/components/schemas/VersionEventOut"}}
    transition_version(version, VersionState.FAILED, reason="weights missing")
    # The versions list's filters do not apply to (or hide) one version's events.
    response = api(member_token).get(f"/api/v1/versions/{version.pk}/events/?state=ready")
    assert response.status_code == 200, response.content
    events = response.json()
    assert isinstance(events, list) and events
    assert set(events[0]) == set(schema["components"]["schemas"]["VersionEventOut"]["properties"])


def test_an_unrouted_api_url_answers_the_json_error_body(api, member_token):
    response = api(member_token).get("/api/v1/versions/0.5/events/")
    assert response["Content-Type"] == "application/json"
    api_error(response, 404, "not_found")
    page = api(member_token).get("/no-such-page/")
    assert page.status_code == 404
    assert page["Content-Type"].startswith("text/html")


def test_an_oversized_body_is_a_413_with_the_json_error_body(settings, api, member_token, model):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api(member_token).patch(
        f"/api/v1/models/{model.pk}/", {"description": "x" * 2000}, format="json"
    )
    assert response["Content-Type"] == "application/json"
    assert "1000 bytes" in api_error(response, 413, "request_too_large")["message"]
