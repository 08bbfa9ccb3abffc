"""The Vertex AI bearer token: a fixed one, or application default credentials refreshed in a thread, one
refresh at a time; what is missing said as a ModelConfigError; and the Vertex base URL."""

from __future__ import annotations

import asyncio
import datetime
import sys
import threading
import urllib.parse
from typing import Any

import google.auth
import google.auth.exceptions
import google.oauth2.credentials
import httpx
import pytest

from orchestrator.errors import ModelConfigError
from orchestrator.providers import google_auth
from orchestrator.providers.google_auth import GoogleAuth, build_google_auth, build_vertex_base_url

URL = "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/publishers/google/models/g"


class FakeCredentials:
    """Credentials whose refresh is counted, recorded by thread, and can be made slow or failing."""

    def __init__(self, *, valid: bool = False, error: Exception | None = None, delay_s: float = 0.0) -> None:
        self.valid = valid
        self.error = error
        self.delay_s = delay_s
        self.refreshes = 0
        self.threads: list[threading.Thread] = []
        self.token: str | None = "old" if valid else None
        self.quota_project_id: str | None = None

    def refresh(self, request: Any) -> None:
        del request
        self.threads.append(threading.current_thread())
        self.refreshes += 1
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        if self.error is not None:
            raise self.error
        self.token = f"token-{self.refreshes}"
        self.valid = True

    def apply(self, headers: dict[str, str], token: str | None = None) -> None:
        headers["authorization"] = f"Bearer {token or self.token}"
        if self.quota_project_id:
            headers["x-goog-user-project"] = self.quota_project_id


async def authorize(auth: GoogleAuth) -> dict[str, str]:
    return await auth.authorize("POST", URL, {"content-type": "application/json"}, b"{}")


async def test_a_fixed_token_is_sent_as_it_is() -> None:
    headers = await authorize(GoogleAuth("ya29.fixed"))
    assert headers == {"content-type": "application/json", "authorization": "Bearer ya29.fixed"}


async def test_expired_credentials_are_refreshed_in_a_thread_once_for_callers_together() -> None:
    credentials = FakeCredentials(delay_s=0.05)
    credentials.quota_project_id = "billing"
    auth = GoogleAuth(credentials=credentials)
    results = await asyncio.gather(*(authorize(auth) for _ in range(10)))
    assert credentials.refreshes == 1
    assert credentials.threads[0] is not threading.main_thread()
    assert all(
        h["authorization"] == "Bearer token-1" and h["x-goog-user-project"] == "billing" for h in results
    )


async def test_valid_credentials_are_not_refreshed() -> None:
    credentials = FakeCredentials(valid=True)
    headers = await authorize(GoogleAuth(credentials=credentials))
    assert (credentials.refreshes, headers["authorization"]) == (0, "Bearer old")


async def test_credentials_that_expire_are_refreshed_again() -> None:
    credentials = FakeCredentials()
    auth = GoogleAuth(credentials=credentials)
    assert (await authorize(auth))["authorization"] == "Bearer token-1"
    credentials.valid = False
    assert (await authorize(auth))["authorization"] == "Bearer token-2"


async def test_a_refused_refresh_is_a_model_config_error() -> None:
    refused = google.auth.exceptions.RefreshError("invalid_grant: Token has been expired or revoked.")
    with pytest.raises(ModelConfigError, match="VERTEX_ACCESS_TOKEN"):
        await authorize(GoogleAuth(credentials=FakeCredentials(error=refused)))


async def test_a_passing_refresh_failure_is_googles_own_error() -> None:
    passing = google.auth.exceptions.RefreshError("temporarily unavailable", retryable=True)
    with pytest.raises(google.auth.exceptions.RefreshError):
        await authorize(GoogleAuth(credentials=FakeCredentials(error=passing)))
    unreachable = google.auth.exceptions.TransportError("connection refused")
    with pytest.raises(google.auth.exceptions.TransportError):
        await authorize(GoogleAuth(credentials=FakeCredentials(error=unreachable)))


async def test_default_credentials_are_found_once_with_the_cloud_platform_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = FakeCredentials()
    asked: list[Any] = []

    def default(scopes: list[str]) -> tuple[FakeCredentials, str]:
        asked.append(scopes)
        return found, "my-project"

    monkeypatch.setattr(google.auth, "default", default)
    auth = GoogleAuth()
    assert (await authorize(auth))["authorization"] == "Bearer token-1"
    found.valid = False
    await authorize(auth)
    assert asked == [[google_auth.CLOUD_PLATFORM_SCOPE]]
    assert auth.project_id == "my-project"


async def test_no_default_credentials_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def default(scopes: list[str]) -> None:
        raise google.auth.exceptions.DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", default)
    with pytest.raises(ModelConfigError, match=r"GOOGLE_APPLICATION_CREDENTIALS.*VERTEX_ACCESS_TOKEN"):
        await authorize(GoogleAuth())


async def test_without_google_auth_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.auth", None)
    with pytest.raises(ModelConfigError, match=r"celery-toolloop\[vertex\]"):
        await authorize(GoogleAuth(credentials=FakeCredentials()))
    # A fixed token needs no google-auth at all.
    assert (await authorize(GoogleAuth("t")))["authorization"] == "Bearer t"


async def test_real_credentials_refresh_through_httpx() -> None:
    asked: list[httpx.Request] = []

    def token_endpoint(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(
            200, json={"access_token": "ya29.fresh", "expires_in": 3600, "token_type": "Bearer"}
        )

    credentials = google.oauth2.credentials.Credentials(
        token=None,
        refresh_token="1//refresh",
        client_id="client",
        client_secret="secret",
        token_uri="https://oauth2.googleapis.com/token",
    )
    auth = GoogleAuth(credentials=credentials, transport=httpx.MockTransport(token_endpoint))
    headers = await authorize(auth)
    assert headers["authorization"] == "Bearer ya29.fresh"
    assert credentials.expiry is not None and credentials.expiry > datetime.datetime.now(
        datetime.UTC
    ).replace(tzinfo=None)
    form = urllib.parse.parse_qs(asked[0].content.decode())
    assert (asked[0].method, form["grant_type"], form["refresh_token"]) == (
        "POST",
        ["refresh_token"],
        ["1//refresh"],
    )
    await authorize(auth)
    assert len(asked) == 1  # still valid: no second refresh


async def test_a_token_endpoint_that_cannot_be_reached_is_a_passing_failure() -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    credentials = google.oauth2.credentials.Credentials(
        token=None,
        refresh_token="r",
        client_id="c",
        client_secret="s",
        token_uri="https://oauth2.googleapis.com/token",
    )
    auth = GoogleAuth(credentials=credentials, transport=httpx.MockTransport(unreachable))
    with pytest.raises(google.auth.exceptions.GoogleAuthError) as raised:
        await authorize(auth)
    assert not isinstance(raised.value, ModelConfigError)


@pytest.mark.parametrize(
    ("variables", "url"),
    [
        ({}, None),
        ({"GOOGLE_CLOUD_LOCATION": "us-central1"}, None),
        ({"GOOGLE_CLOUD_PROJECT": "p"}, "https://aiplatform.googleapis.com/v1/projects/p/locations/global"),
        (
            {"GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_CLOUD_LOCATION": "us-central1"},
            "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1",
        ),
        (
            {"GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_CLOUD_LOCATION": "eu"},
            "https://aiplatform.eu.rep.googleapis.com/v1/projects/p/locations/eu",
        ),
    ],
)
def test_vertex_base_url(variables: dict[str, str], url: str | None) -> None:
    expected = f"{url}/publishers/google" if url else None
    assert build_vertex_base_url(variables) == expected


async def test_the_auth_of_the_variables() -> None:
    assert build_google_auth({"VERTEX_ACCESS_TOKEN": " tok "}).token == "tok"
    assert build_google_auth({}).token is None
