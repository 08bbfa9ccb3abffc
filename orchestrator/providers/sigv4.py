"""AWS Signature Version 4 for Bedrock's HTTP calls, by botocore's own signer, and the endpoint to call.

`SigV4Auth(region).authorize(method, url, headers, body)` gives the headers to send: the caller's, plus
`Authorization`, `X-Amz-Date` and, for temporary credentials, `X-Amz-Security-Token` — computed by
`botocore.auth.SigV4Auth` over an `botocore.awsrequest.AWSRequest` of exactly these method, URL, headers and
body bytes. The caller must send those same bytes (serialise the JSON body once, sign it, send it as
content) and the same URL: the signature covers the body's SHA-256, the path, the `host` and every header
given here. Headers a transport adds afterwards (content-length, user-agent, accept-encoding) are not signed,
which SigV4 allows.

Credentials come from botocore's standard chain (environment, shared config and credentials files, SSO,
web identity, container and instance metadata), resolved once, lazily, in a worker thread (the chain may do
network I/O), and reused. Refreshable credentials (assumed roles, SSO, instance profiles) renew themselves;
when one is due, its refresh also runs in a thread, never on the event loop.

botocore is the `bedrock` extra: it is imported only here and only when a Bedrock model is used, so a process
without it fails then, with a `ModelConfigError` saying `pip install 'celery-toolloop[bedrock]'`. No
credentials, or credentials configured wrong (an unknown profile, a partial key pair, an expired SSO login),
is a `ModelConfigError` too (from `authorize`): asking again will not help. Any other failure of the chain (an
STS or metadata endpoint that did not answer) leaves `authorize` as botocore raised it, for the caller to
retry (`sending.build_headers` makes it a retryable transport error).

`build_base_url` finds the endpoint as botocore does for `bedrock-runtime`:
`AWS_ENDPOINT_URL_BEDROCK_RUNTIME`, else `AWS_ENDPOINT_URL` (both ignored when
`AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is `true`), else the region's public endpoint (`build_endpoint`). The
shared config file's `services` sections are not read.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from orchestrator.errors import ModelConfigError

__all__ = [
    "ENDPOINT_ENV_VARS",
    "IGNORE_ENDPOINTS_ENV_VAR",
    "INSTALL_HINT",
    "SERVICE",
    "SigV4Auth",
    "build_base_url",
    "build_endpoint",
    "require_botocore",
]

# The signing name of Bedrock's runtime API (its endpoints are `bedrock-runtime.*`, its scope `bedrock`).
SERVICE = "bedrock"
INSTALL_HINT = "pip install 'celery-toolloop[bedrock]'"
# botocore's lookup order for a configured endpoint: the service's own variable (the service id
# "Bedrock Runtime", upper-cased, spaces as underscores), then the global one.
ENDPOINT_ENV_VARS = ("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "AWS_ENDPOINT_URL")
IGNORE_ENDPOINTS_ENV_VAR = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"
# botocore's errors that say the credentials are configured wrong, not that an endpoint failed to answer.
_CONFIG_ERRORS = (
    "ConfigNotFound",
    "InvalidConfigError",
    "NoCredentialsError",
    "PartialCredentialsError",
    "ProfileNotFound",
    "SSOTokenLoadError",
    "UnauthorizedSSOTokenError",
    "UnknownCredentialError",
)
# botocore's `validate_region_name`: a region becomes part of a host name.
_REGION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")
# The DNS suffix of each AWS partition other than the commercial one (botocore's partitions.json), by the
# start of its region names; longest prefixes first, so that `us-isob-` is not read as `us-iso-`.
_PARTITION_SUFFIXES = (
    ("us-isob-", "sc2s.sgov.gov"),
    ("us-isof-", "csp.hci.ic.gov"),
    ("us-iso-", "c2s.ic.gov"),
    ("eu-isoe-", "cloud.adc-e.uk"),
    ("eusc-", "amazonaws.eu"),
    ("cn-", "amazonaws.com.cn"),
)
_DEFAULT_SUFFIX = "amazonaws.com"


def require_botocore() -> ModuleType:
    """botocore, imported; a `ModelConfigError` naming the extra to install when it is missing."""
    try:
        return importlib.import_module("botocore")
    except ImportError as exc:
        raise ModelConfigError(
            f"bedrock models need botocore, which is not installed: {INSTALL_HINT}"
        ) from exc


def build_endpoint(region: str) -> str:
    """`https://bedrock-runtime.{region}.amazonaws.com` (`.amazonaws.com.cn` in China, and so on for AWS's
    other partitions); a `ModelConfigError` for a region that cannot be part of a host name."""
    region = region.strip()
    if not _REGION.match(region):
        raise ModelConfigError(
            f"AWS region {region!r} is not a region name (set AWS_REGION, e.g. us-east-1)"
            if region
            else "bedrock models need an AWS region: set AWS_REGION (or AWS_DEFAULT_REGION), e.g. us-east-1"
        )
    suffix = next((s for prefix, s in _PARTITION_SUFFIXES if region.startswith(prefix)), _DEFAULT_SUFFIX)
    return f"https://bedrock-runtime.{region}.{suffix}"


def build_base_url(environ: Mapping[str, str], region: str) -> str:
    """The base URL of Bedrock's runtime API, without a trailing slash: a configured endpoint override
    (`ENDPOINT_ENV_VARS`, in botocore's order, unless `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`), else
    `build_endpoint(region)`."""
    # botocore reads the flag with `ensure_boolean`: only "true", in any case, turns it on.
    if environ.get(IGNORE_ENDPOINTS_ENV_VAR, "").lower() != "true":
        for name in ENDPOINT_ENV_VARS:
            value = environ.get(name, "").strip()
            if value:
                return value.rstrip("/")
    return build_endpoint(region)


class SigV4Auth:
    """Signs Bedrock requests with SigV4 for one region, with credentials from AWS's standard chain.

    `credentials` (botocore `Credentials`, or anything with `access_key`, `secret_key`, `token`) replaces the
    chain: tests give fixed ones. One instance is shared by every call of a process and by any event loop:
    the chain is resolved at most once, under a thread lock.
    """

    def __init__(self, region: str, *, service: str = SERVICE, credentials: object | None = None) -> None:
        require_botocore()
        self.region = region
        self.service = service
        self._credentials: Any = credentials
        self._lock = threading.Lock()

    async def authorize(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> dict[str, str]:
        """`headers` plus SigV4's for this exact request; `ModelConfigError` when no credentials are found."""
        credentials = self._credentials
        if credentials is None:
            credentials = await asyncio.to_thread(self._resolve)
        frozen = await _freeze(credentials)
        return _sign(frozen, self.service, self.region, method=method, url=url, headers=headers, body=body)

    def _resolve(self) -> Any:
        with self._lock:
            if self._credentials is None:
                self._credentials = _load_credentials()
            return self._credentials


def _load_credentials() -> Any:
    require_botocore()
    session_module = importlib.import_module("botocore.session")
    try:
        credentials = session_module.get_session().get_credentials()
    except _config_errors() as exc:
        raise ModelConfigError(f"AWS credentials could not be loaded for bedrock: {exc}") from exc
    if credentials is None:
        raise ModelConfigError(
            "bedrock models need AWS credentials and none were found (environment variables, "
            "~/.aws/credentials or config, SSO, web identity, container or instance metadata)"
        )
    return credentials


async def _freeze(credentials: Any) -> Any:
    """The credentials' current values, as one consistent snapshot; a due refresh runs in a thread."""
    freeze = getattr(credentials, "get_frozen_credentials", None)
    if freeze is None:
        return credentials
    refresh_needed = getattr(credentials, "refresh_needed", None)
    try:
        if callable(refresh_needed) and refresh_needed():
            return await asyncio.to_thread(freeze)
        return freeze()
    except _config_errors() as exc:
        raise ModelConfigError(f"AWS credentials could not be refreshed for bedrock: {exc}") from exc


def _config_errors() -> tuple[type[Exception], ...]:
    exceptions = importlib.import_module("botocore.exceptions")
    return tuple(getattr(exceptions, name) for name in _CONFIG_ERRORS)


def _sign(
    credentials: Any,
    service: str,
    region: str,
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
) -> dict[str, str]:
    auth = importlib.import_module("botocore.auth")
    awsrequest = importlib.import_module("botocore.awsrequest")
    request = awsrequest.AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    auth.SigV4Auth(credentials, service, region).add_auth(request)
    return {str(name): str(value) for name, value in request.headers.items()}
