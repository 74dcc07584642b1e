"""The plugin upload takes multipart/form-data only; any other body is a documented 415."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


@pytest.mark.django_db
def test_a_json_body_is_refused_415_with_the_error_body_and_the_schema_says_so(member_token):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {member_token}")
    answer = client.post("/api/v1/plugins/", {"wheel": "x"}, format="json")
    assert answer.status_code == 415
    assert answer.json()["error"]["message"]
    schema = client.get("/api/schema/?format=json").json()
    assert "415" in schema["paths"]["/api/v1/plugins/"]["post"]["responses"]
