"""The OpenAPI schema and the docs pages, as a browser and an API client meet them."""

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from tasks_app.services import tenant_membership_ensure

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize("page", ["/runtime/docs", "/runtime/redoc"])
def test_it_sends_a_browser_without_a_session_to_sign_in_and_back(db, page):
    response = Client().get(page, HTTP_ACCEPT=BROWSER_ACCEPT)

    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={page}"


def test_it_shows_the_docs_after_signing_in(tenant):
    user = get_user_model().objects.create_user("ada", password="a long enough passphrase", is_staff=True)
    tenant_membership_ensure(user=user, tenant=tenant)
    browser = Client()

    login_url = browser.get("/runtime/docs", HTTP_ACCEPT=BROWSER_ACCEPT)["Location"]
    signed_in = browser.post(login_url, {"username": "ada", "password": "a long enough passphrase",
                                         "next": "/runtime/docs"})
    docs = browser.get(signed_in["Location"], HTTP_ACCEPT=BROWSER_ACCEPT)

    assert signed_in.status_code == 302 and signed_in["Location"] == "/runtime/docs"
    assert docs.status_code == 200 and docs["Content-Type"].startswith("text/html")
    assert b"swagger" in docs.content.lower()


@pytest.mark.parametrize("page", ["/runtime/docs", "/runtime/redoc"])
def test_it_shows_the_docs_to_a_bearer_token(api, page):
    response = api.get(page, HTTP_ACCEPT=BROWSER_ACCEPT)

    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")


def test_it_answers_a_bad_bearer_token_on_the_docs_with_a_json_problem(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer art_not-a-token")

    response = client.get("/runtime/docs")

    assert response.status_code == 401 and response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "/runtime/problems/not-authenticated"


@pytest.mark.parametrize("query", ["", "?format=yaml", "?format=json"])
def test_it_answers_the_schema_without_credentials_with_a_json_problem(db, query):
    response = APIClient().get(f"/runtime/schema{query}")

    assert response.status_code == 401 and response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "/runtime/problems/not-authenticated"


def test_it_serves_the_schema_as_json_unless_asked_for_yaml(api):
    default = api.get("/runtime/schema")
    as_yaml = api.get("/runtime/schema?format=yaml")
    accept_yaml = api.get("/runtime/schema", HTTP_ACCEPT="application/yaml")
    browser = api.get("/runtime/schema", HTTP_ACCEPT=BROWSER_ACCEPT)

    assert default.status_code == 200 and "json" in default["Content-Type"]
    assert default.json()["openapi"].startswith("3.")
    for response in (as_yaml, accept_yaml):
        assert response["Content-Type"].startswith("application/yaml")
        assert yaml.safe_load(response.content)["paths"] == default.json()["paths"]
    assert browser.status_code == 200 and "json" in browser["Content-Type"]


def test_it_describes_every_operation_in_words_under_a_readable_tag(api):
    schema = api.get("/runtime/schema").json()

    operations = [op for path in schema["paths"].values() for op in path.values()]
    assert len(operations) >= 5
    for op in operations:
        assert op["summary"][0].isupper() and " " in op["summary"], op["operationId"]
        assert len(op["description"]) > 40 and "Api" not in op["description"], op["operationId"]
        assert op["tags"] and all(tag[0].isupper() and tag != "runtime" for tag in op["tags"]), op["operationId"]


def test_it_documents_both_kinds_of_bearer_token_and_the_oauth_flow(api):
    schema = api.get("/runtime/schema").json()

    schemes = schema["components"]["securitySchemes"]
    assert "`aro_" in schemes["bearerToken"]["description"] and "/runtime" in schemes["bearerToken"]["description"]
    flow = schemes["oauth2"]["flows"]["authorizationCode"]
    assert (flow["authorizationUrl"], flow["tokenUrl"]) == ("/oauth/authorize/", "/oauth/token/")
    assert set(flow["scopes"]) == {"tasks:read", "tasks:write", "steer"}
    task_list = schema["paths"]["/runtime/tasks"]["get"]
    assert {"oauth2": []} in task_list["security"] and {"bearerToken": []} in task_list["security"]
