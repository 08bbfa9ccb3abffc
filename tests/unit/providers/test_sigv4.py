"""SigV4: with a fixed credential and clock the signature is stable, equal to botocore's own signer's over the
same request, and covers exactly the body bytes sent; credentials resolved once, lazily; the endpoint as
botocore finds it."""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from typing import Any

import botocore.auth
import botocore.credentials
import pytest
from botocore.awsrequest import AWSRequest

from orchestrator.errors import ModelConfigError
from orchestrator.providers import bedrock, sigv4

pytestmark = pytest.mark.timeout(60)

FIXED_NOW = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
URL = bedrock.build_url(
    sigv4.build_endpoint("us-east-1"), "us.anthropic.claude-3-7-sonnet-20250219-v1:0", stream=False
)
BODY = json.dumps({"messages": [{"role": "user", "content": [{"text": "Hé"}]}]}, ensure_ascii=False).encode()
HEADERS = {"content-type": "application/json"}


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: FIXED_NOW)


def credentials(token: str | None = None) -> botocore.credentials.Credentials:
    return botocore.credentials.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)


def botocore_signed(creds: Any, body: bytes = BODY) -> dict[str, str]:
    request = AWSRequest(method="POST", url=URL, data=body, headers=dict(HEADERS))
    botocore.auth.SigV4Auth(creds, "bedrock", "us-east-1").add_auth(request)
    return dict(request.headers.items())


async def test_signature_is_botocores_over_the_same_request() -> None:
    signed = await sigv4.SigV4Auth("us-east-1", credentials=credentials()).authorize(
        "POST", URL, HEADERS, BODY
    )
    assert signed == botocore_signed(credentials())
    assert signed["content-type"] == "application/json"
    assert signed["X-Amz-Date"] == "20250102T030405Z"
    authorization = signed["Authorization"]
    assert authorization.startswith(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250102/us-east-1/bedrock/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date, Signature="
    )
    assert "X-Amz-Security-Token" not in signed


async def test_the_signature_is_stable_and_covers_the_body_bytes() -> None:
    auth = sigv4.SigV4Auth("us-east-1", credentials=credentials())
    first = await auth.authorize("POST", URL, HEADERS, BODY)
    assert await auth.authorize("POST", URL, HEADERS, BODY) == first
    other = await auth.authorize("POST", URL, HEADERS, BODY + b" ")
    assert other["Authorization"] != first["Authorization"]
    # Verified independently: the canonical request hashes exactly the bytes given.
    request = AWSRequest(method="POST", url=URL, data=BODY, headers=dict(HEADERS))
    request.context["timestamp"] = "20250102T030405Z"
    signer = botocore.auth.SigV4Auth(credentials(), "bedrock", "us-east-1")
    assert signer.canonical_request(request).endswith(hashlib.sha256(BODY).hexdigest())
    # The path is signed as botocore signs a URI label with `:` (double-encoded), the URL sent as built.
    assert "/model/us.anthropic.claude-3-7-sonnet-20250219-v1%253A0/converse" in signer.canonical_request(
        request
    )


async def test_session_token_is_sent_and_signed() -> None:
    creds = credentials(token="SESSION")
    signed = await sigv4.SigV4Auth("us-east-1", credentials=creds).authorize("POST", URL, HEADERS, BODY)
    assert signed == botocore_signed(creds)
    assert signed["X-Amz-Security-Token"] == "SESSION"
    assert "x-amz-security-token" in signed["Authorization"]


async def test_credentials_are_resolved_once_from_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    class Session:
        def get_credentials(self) -> botocore.credentials.Credentials:
            calls.append(1)
            return credentials()

    monkeypatch.setattr("botocore.session.get_session", Session)
    auth = sigv4.SigV4Auth("us-east-1")
    assert calls == []  # nothing resolved before the first call
    signed = await auth.authorize("POST", URL, HEADERS, BODY)
    await auth.authorize("POST", URL, HEADERS, BODY)
    assert calls == [1]
    assert signed == botocore_signed(credentials())


async def test_no_credentials_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Session:
        def get_credentials(self) -> None:
            return None

    monkeypatch.setattr("botocore.session.get_session", Session)
    with pytest.raises(ModelConfigError, match="need AWS credentials"):
        await sigv4.SigV4Auth("us-east-1").authorize("POST", URL, HEADERS, BODY)


async def test_a_misconfigured_chain_is_a_config_error_and_a_failing_endpoint_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import botocore.exceptions

    raised: list[Exception] = [botocore.exceptions.ProfileNotFound(profile="nope")]

    class Session:
        def get_credentials(self) -> None:
            raise raised[0]

    monkeypatch.setattr("botocore.session.get_session", Session)
    with pytest.raises(ModelConfigError, match="could not be loaded"):
        await sigv4.SigV4Auth("us-east-1").authorize("POST", URL, HEADERS, BODY)
    # An STS or metadata endpoint that did not answer may answer next time: not a config error.
    raised[0] = botocore.exceptions.CredentialRetrievalError(provider="sts", error_msg="timeout")
    with pytest.raises(botocore.exceptions.CredentialRetrievalError):
        await sigv4.SigV4Auth("us-east-1").authorize("POST", URL, HEADERS, BODY)


async def test_refreshable_credentials_refresh_off_the_event_loop() -> None:
    refreshed: list[str] = []

    def refresh() -> dict[str, str]:
        refreshed.append("yes")
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {
            "access_key": "AKIDNEW",
            "secret_key": "new",
            "token": "T2",
            "expiry_time": expiry.isoformat(),
        }

    expired = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    creds = botocore.credentials.RefreshableCredentials("AKIDOLD", "old", "T1", expired, refresh, "test")
    signed = await sigv4.SigV4Auth("us-east-1", credentials=creds).authorize("POST", URL, HEADERS, BODY)
    assert refreshed == ["yes"]
    assert "Credential=AKIDNEW/" in signed["Authorization"]
    assert signed["X-Amz-Security-Token"] == "T2"


def test_without_botocore_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "botocore", None)
    with pytest.raises(ModelConfigError, match=r"pip install 'celery-toolloop\[bedrock\]'"):
        sigv4.SigV4Auth("us-east-1")


@pytest.mark.parametrize(
    ("region", "endpoint"),
    [
        ("us-east-1", "https://bedrock-runtime.us-east-1.amazonaws.com"),
        ("eu-central-1", "https://bedrock-runtime.eu-central-1.amazonaws.com"),
        ("us-gov-west-1", "https://bedrock-runtime.us-gov-west-1.amazonaws.com"),
        ("cn-north-1", "https://bedrock-runtime.cn-north-1.amazonaws.com.cn"),
        ("us-isob-east-1", "https://bedrock-runtime.us-isob-east-1.sc2s.sgov.gov"),
    ],
)
def test_build_endpoint(region: str, endpoint: str) -> None:
    assert sigv4.build_endpoint(region) == endpoint


@pytest.mark.parametrize("region", ["", "us-east-1.evil.com", "us east", "-x"])
def test_a_region_that_is_no_host_name_part_is_refused(region: str) -> None:
    with pytest.raises(ModelConfigError, match="region"):
        sigv4.build_endpoint(region)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "https://bedrock-runtime.us-west-2.amazonaws.com"),
        ({"AWS_ENDPOINT_URL": "http://localhost:4566/"}, "http://localhost:4566"),
        (
            {"AWS_ENDPOINT_URL": "http://global", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://service"},
            "http://service",
        ),
        ({"AWS_ENDPOINT_URL_BEDROCK_RUNTIME": ""}, "https://bedrock-runtime.us-west-2.amazonaws.com"),
        (
            {"AWS_ENDPOINT_URL": "http://global", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "TRUE"},
            "https://bedrock-runtime.us-west-2.amazonaws.com",
        ),
        ({"AWS_ENDPOINT_URL": "http://global", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "1"}, "http://global"),
    ],
)
def test_build_base_url_reads_botocores_variables(environ: dict[str, str], expected: str) -> None:
    assert sigv4.build_base_url(environ, "us-west-2") == expected


@pytest.mark.parametrize(
    "environ",
    [
        {"AWS_ENDPOINT_URL": "http://global", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://service"},
        {"AWS_ENDPOINT_URL": "http://global"},
        {"AWS_ENDPOINT_URL": "http://global", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"},
        {},
    ],
)
def test_build_base_url_agrees_with_botocore(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import botocore.session

    for name in [*sigv4.ENDPOINT_ENV_VARS, sigv4.IGNORE_ENDPOINTS_ENV_VAR, "AWS_CONFIG_FILE", "AWS_PROFILE"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    client = botocore.session.get_session().create_client(
        "bedrock-runtime", region_name="us-west-2", aws_access_key_id="a", aws_secret_access_key="b"
    )
    assert sigv4.build_base_url(environ, "us-west-2") == client.meta.endpoint_url.rstrip("/")


async def test_what_httpx_sends_is_what_was_signed() -> None:
    import httpx

    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    signed = await sigv4.SigV4Auth("us-east-1", credentials=credentials()).authorize(
        "POST", URL, HEADERS, BODY
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        await http.post(URL, content=BODY, headers=signed)
    (request,) = sent
    assert request.content == BODY
    # Re-signing what went over the wire (its URL, its signed headers, its bytes) gives the same signature.
    names = ("content-type", "x-amz-date")
    again = AWSRequest(
        method=request.method,
        url=str(request.url),
        data=request.content,
        headers={n: request.headers[n] for n in names},
    )
    botocore.auth.SigV4Auth(credentials(), "bedrock", "us-east-1").add_auth(again)
    assert again.headers["Authorization"] == request.headers["authorization"]
    assert request.headers["host"] == "bedrock-runtime.us-east-1.amazonaws.com"
