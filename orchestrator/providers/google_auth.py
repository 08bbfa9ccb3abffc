"""A Google OAuth bearer token for Vertex AI calls, and the Vertex AI endpoint to call.

`GoogleAuth().authorize(method, url, headers, body)` gives the headers to send: the caller's, plus
`authorization: Bearer <token>` (and `x-goog-user-project` when the credentials name a quota project). The
token is the one given to the constructor (`VERTEX_ACCESS_TOKEN`: sent as it is, never refreshed), else an
access token of google-auth's application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, the
gcloud user's, a workload identity, the metadata server …) with the `cloud-platform` scope. Those are found
once, lazily, and refreshed when they are missing or expire (google-auth counts a token as expired a few
minutes early); finding and refreshing do network I/O, so both run in a worker thread, never on the event
loop, and one refresh at a time: callers that find the token stale together wait for the same refresh.
The refresh's HTTP goes through httpx (`_HttpxRequest`), so the extra needs no other HTTP library.

google-auth is the `vertex` extra: it is imported only here and only when a Vertex model is called, so a
process without it fails then, with a `ModelConfigError` saying `pip install 'celery-toolloop[vertex]'`.
No default credentials, or credentials the token endpoint refuses for good, are a `ModelConfigError` too
(from `authorize`): the call fails saying what to set. A refresh that failed for a passing reason (the token
endpoint did not answer) raises google-auth's own error, which the caller treats as a retryable failure.

`build_vertex_base_url` finds the base URL of Google's models for `GOOGLE_CLOUD_PROJECT` and
`GOOGLE_CLOUD_LOCATION` (default `global`), as Google's own SDK does; `build_google_auth` the auth for
`VERTEX_ACCESS_TOKEN`.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from orchestrator.errors import ModelConfigError

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "INSTALL_HINT",
    "LOCATION_VARIABLE",
    "PROJECT_VARIABLE",
    "TOKEN_VARIABLE",
    "GoogleAuth",
    "build_google_auth",
    "build_vertex_base_url",
]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
INSTALL_HINT = "pip install 'celery-toolloop[vertex]'"
PROJECT_VARIABLE = "GOOGLE_CLOUD_PROJECT"
LOCATION_VARIABLE = "GOOGLE_CLOUD_LOCATION"
TOKEN_VARIABLE = "VERTEX_ACCESS_TOKEN"
DEFAULT_LOCATION = "global"
# Vertex AI's multi-region locations have a host of their own; a single region is `{region}-aiplatform`.
_MULTI_REGIONS = frozenset({"us", "eu"})
REFRESH_TIMEOUT_S = 30.0


class _Credentials(Protocol):
    """What of google-auth's credentials this module uses."""

    @property
    def valid(self) -> bool: ...

    def refresh(self, request: Any) -> None: ...

    def apply(self, headers: dict[str, str], token: str | None = None) -> None: ...


def build_vertex_base_url(variables: Mapping[str, str]) -> str | None:
    """The base URL of Google's models on Vertex AI for `GOOGLE_CLOUD_PROJECT` in `GOOGLE_CLOUD_LOCATION`
    (`global` when unset: the one endpoint with no regional host; `us`, `eu`: the multi-region hosts);
    None without a project."""
    project = (variables.get(PROJECT_VARIABLE) or "").strip()
    if not project:
        return None
    location = (variables.get(LOCATION_VARIABLE) or "").strip() or DEFAULT_LOCATION
    if location == DEFAULT_LOCATION:
        host = "aiplatform.googleapis.com"
    elif location in _MULTI_REGIONS:
        host = f"aiplatform.{location}.rep.googleapis.com"
    else:
        host = f"{location}-aiplatform.googleapis.com"
    return (
        f"https://{host}/v1/projects/{quote(project, safe='')}/locations/{quote(location, safe='')}"
        "/publishers/google"
    )


def build_google_auth(variables: Mapping[str, str]) -> GoogleAuth:
    """The auth of Vertex AI calls: `VERTEX_ACCESS_TOKEN` when set, else application default credentials."""
    return GoogleAuth((variables.get(TOKEN_VARIABLE) or "").strip() or None)


class GoogleAuth:
    """A bearer token for each call: a fixed one, or application default credentials kept fresh."""

    def __init__(
        self,
        token: str | None = None,
        *,
        scopes: Sequence[str] = (CLOUD_PLATFORM_SCOPE,),
        credentials: _Credentials | None = None,
        refresh_timeout_s: float = REFRESH_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        # `credentials`: already found ones (any google-auth credentials), instead of the default ones;
        # `transport`: what the token refreshes go through (httpx's own by default).
        self.token = token
        self.scopes = tuple(scopes)
        self.refresh_timeout_s = refresh_timeout_s
        self.transport = transport
        self.project_id: str | None = None
        self._credentials = credentials
        # The thread that refreshes holds this; the loop's callers queue on their own loop's lock first.
        self._thread_lock = threading.Lock()
        self._loop_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def authorize(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        """`headers` plus the bearer token (a bearer token signs no part of the request itself)."""
        del method, url, body
        sent = dict(headers)
        if self.token is not None:
            sent["authorization"] = f"Bearer {self.token}"
            return sent
        credentials = self._credentials
        if credentials is None or not credentials.valid:
            async with self._loop_lock():
                # Those that waited find the token the first one got.
                credentials = self._credentials
                if credentials is None or not credentials.valid:
                    credentials = await asyncio.to_thread(self._refresh)
        credentials.apply(sent)
        return sent

    def _loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._loop_locks.get(loop)
        if lock is None:
            lock = self._loop_locks[loop] = asyncio.Lock()
        return lock

    def _refresh(self) -> _Credentials:
        """Find the default credentials (once) and refresh them; in a worker thread."""
        with self._thread_lock:
            credentials = self._credentials
            if credentials is not None and credentials.valid:
                return credentials  # another loop's caller refreshed them meanwhile
            auth = _import("google.auth")
            exceptions = _import("google.auth.exceptions")
            if credentials is None:
                credentials = self._credentials = self._find_default(auth, exceptions)
            try:
                credentials.refresh(_HttpxRequest(self.refresh_timeout_s, self.transport))
            except exceptions.RefreshError as exc:
                if getattr(exc, "retryable", False):
                    raise
                raise ModelConfigError(
                    f"Google refused to refresh the application default credentials' token: {exc}. Sign in "
                    f"again (gcloud auth application-default login), check the account's roles, or set "
                    f"{TOKEN_VARIABLE}"
                ) from exc
            return credentials

    def _find_default(self, auth: ModuleType, exceptions: ModuleType) -> _Credentials:
        try:
            credentials, project_id = auth.default(scopes=list(self.scopes))
        except exceptions.DefaultCredentialsError as exc:
            raise ModelConfigError(
                f"Vertex AI needs Google credentials and none were found: {exc}. Set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service account key file, run `gcloud auth "
                f"application-default login`, or set {TOKEN_VARIABLE}"
            ) from exc
        self.project_id = project_id if isinstance(project_id, str) else None
        found: _Credentials = credentials
        return found


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelConfigError(
            f"Vertex AI models need google-auth, which this process lacks: {INSTALL_HINT}"
        ) from exc


@dataclass(frozen=True)
class _Answer:
    """google-auth's view of an HTTP answer (`google.auth.transport.Response`)."""

    status: int
    headers: Mapping[str, str]
    data: bytes


class _HttpxRequest:
    """google-auth's HTTP callable (`google.auth.transport.Request`) over a short-lived httpx client: a
    token is refreshed about once an hour, so no pool is kept."""

    def __init__(self, timeout_s: float, transport: httpx.BaseTransport | None = None) -> None:
        self.timeout_s = timeout_s
        self.transport = transport

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _Answer:
        del kwargs  # transport options of other HTTP libraries
        try:
            with httpx.Client(timeout=timeout or self.timeout_s, transport=self.transport) as client:
                response = client.request(method, url, content=body, headers=dict(headers or {}))
        except httpx.HTTPError as exc:
            # The interface's error: google-auth reads it as a failure to reach the token endpoint.
            raise _import("google.auth.exceptions").TransportError(exc) from exc
        return _Answer(response.status_code, dict(response.headers), response.content)
