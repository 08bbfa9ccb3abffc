"""What one POST of a model call sends: the body's bytes and its headers, authorised per attempt.

Most providers are authorised by a fixed header (a bearer key, `x-api-key`), set once on the client. Some
compute credentials per request from the exact bytes sent (AWS SigV4) or hold a token that expires (a Google
OAuth token): a `RequestAuth` is asked for the headers of every attempt, so the body is encoded once, here,
and what is signed is what is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from orchestrator.errors import ModelConfigError
from orchestrator.model import ProviderError
from orchestrator.providers.common import transport_error

# The error of a call whose credentials are missing: not retried, it says what to set.
MISSING_CREDENTIALS = "missing_credentials"


class RequestAuth(Protocol):
    """What authorises a call whose credentials are computed per request (AWS SigV4, a Google OAuth token):
    the headers to send, given the request's method, URL, headers and exact body bytes."""

    async def authorize(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]: ...


def encode_body(body: Mapping[str, Any]) -> bytes:
    """A request body's bytes, as sent and as signed: compact UTF-8 JSON (what httpx's `json=` sends)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def build_headers(
    provider: str, url: str, headers: Mapping[str, str], content: bytes, auth: RequestAuth | None
) -> dict[str, str] | ProviderError:
    """The headers of one POST of `content`: the client's own, the JSON content type, and what `auth` adds
    (asked again for every attempt, so a retry is signed with fresh credentials).

    Credentials that cannot be found (`ModelConfigError`: no AWS credentials, no Google default
    credentials, an extra not installed) fail the call for good, saying what to set; any other failure to
    get them (a token endpoint that did not answer) is a retryable transport error."""
    sent = {"content-type": "application/json", **headers}
    if auth is None:
        return sent
    try:
        return await auth.authorize("POST", url, sent, content)
    except ModelConfigError as exc:
        return ProviderError(
            provider=provider, type=MISSING_CREDENTIALS, code=MISSING_CREDENTIALS, message=str(exc)
        )
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        return transport_error(provider, f"could not authorise the call to {url}: {why}")
