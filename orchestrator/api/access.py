"""Who calls the HTTP API and what they may do: the API keys of tenants (`TOOLLOOP_API_KEYS`) and the one
admin token (`TOOLLOOP_API_TOKEN`).

`TOOLLOOP_API_KEYS` is a JSON object mapping each key to `{"tenant", "scopes", "tools", "name"}` (`KeyEntry`).
A key is written as itself, or as `"sha256:<64 hex digits>"`, its SHA-256, so that the setting holds no
secret. A caller is a `Caller`: its tenant, its scopes (`SCOPES`), when its entry names them the only tools it
may use, and its name (who decided an approval given from the pages). The token is an admin key of the tenant
"default": every scope, every tenant, every tool. With neither setting the API is open, and every request is
the admin's.

The rules, written once here and applied by the routes (`api.app`, `api.pages.routes`):

- a route needs a scope (`require`): `submit` (a turn, a direct tool call), `read` (turns, their events,
  the tools, the pages), `approve`, `cancel`, `admin` (`/metrics`, and every tenant); without it, 403;
- a key sees only its tenant's turns (`require_turn`): another tenant's turn is a 404 with the body of an
  unknown turn's, so a key cannot learn what other tenants' turns exist; a key with `admin` sees all;
- a key submits for its own tenant: a body naming another is a 403, unless the key has `admin`
  (`build_tenant`);
- a key uses only its tools: with `tools`, only those (a sensitive one included); without, every tool but
  the sensitive ones, a sensitive tool named in a turn being refused as an unknown tool is, so that its
  existence is not told either (`find_tool_refusals`); the admin, any.

Keys are compared as their SHA-256 digests, every entry every time, in constant time (`hmac.compare_digest`).
A page session (`api.pages.auth`) is an HMAC per key, mapped back to the key's caller: a session sees what
its key sees. For a key written as itself it is an HMAC of the key; a key given by its hash leaves the API
nothing secret of its own, so its sessions are an HMAC of the hash under the token when there is one, else
under a secret drawn when the process starts (its page sessions then end with the process, and one API
replica's are not another's). A page session is for reads, and for one write: an approval from the turn
page (`require_turn("approve", page_writes=True)`) with the session's CSRF token in its
`X-Toolloop-CSRF` header (`api.pages.auth.build_csrf_token`, double submit), which another site's page
cannot read nor send; submits and cancels stay bearer-only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.api.pages.auth import (
    CSRF_HEADER,
    READ_METHODS,
    SESSION_COOKIE,
    build_csrf_token,
    build_session_value,
)
from orchestrator.errors import ApiKeysError
from orchestrator.settings import Settings
from workers.contract import DEFAULT_TENANT, TENANT_PATTERN, ToolSpec, build_listing

Scope = Literal["submit", "read", "approve", "cancel", "admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
SETTING = "TOOLLOOP_API_KEYS"
HASH_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# The label of a tenant no configured key has, on the API's per-tenant metrics (which stay bounded).
OTHER_TENANTS = "other"

BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description=(
        "An API key of `TOOLLOOP_API_KEYS`, or `TOOLLOOP_API_TOKEN` (the admin's), when the API has either "
        "(401 without one); reads also accept the turn pages' session cookie. `/healthz` is always open."
    ),
)


class KeyEntry(BaseModel):
    """One key's entry in `TOOLLOOP_API_KEYS`: its tenant, its scopes, the only tools it may use (None:
    every tool but the sensitive ones), and a name for whoever holds it (who decided an approval given from
    the pages)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(pattern=TENANT_PATTERN)
    scopes: list[Scope] = Field(min_length=1)
    tools: list[str] | None = None
    name: str | None = Field(default=None, min_length=1, max_length=100)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a key's tenant, scopes, tools (None: every tool its scopes allow) and name;
    `page_session` when it came with a page's session cookie rather than a bearer token."""

    tenant: str
    scopes: frozenset[str]
    tools: frozenset[str] | None = None
    name: str | None = None
    page_session: bool = False

    @property
    def label(self) -> str:
        """Who this is, as an approval's `decided_by` says: `tenant/name`, or the tenant alone."""
        return f"{self.tenant}/{self.name}" if self.name else self.tenant

    def can(self, scope: Scope) -> bool:
        """True when the caller has `scope`; `admin` has every scope (everything, for every tenant)."""
        return scope in self.scopes or "admin" in self.scopes

    @property
    def every_tenant(self) -> bool:
        """True for the admin: it sees, and submits for, every tenant."""
        return self.can("admin")

    def sees(self, tenant: str) -> bool:
        """True when the caller may see a turn of `tenant`."""
        return self.every_tenant or tenant == self.tenant


# The token's caller, and every request's when the API has neither a token nor keys.
ADMIN = Caller(DEFAULT_TENANT, frozenset(SCOPES), name="admin")


@dataclass(frozen=True)
class ApiKey:
    """A configured key as the API keeps it: its SHA-256, its caller, and its page session's value."""

    digest: bytes
    caller: Caller
    session: str


def build_digest(key: str) -> bytes:
    """The SHA-256 of a key as a caller sends it."""
    return hashlib.sha256(key.encode()).digest()


def _describe(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'entry'}: {item['msg']}" for item in error.errors()
    )


class _Pairs(list[tuple[str, Any]]):
    """A JSON object's members in order, as parsed (`object_pairs_hook`), a name given twice kept twice."""


def _as_object(value: Any) -> Any:
    # A value parsed into `_Pairs`, its objects made dicts again (an entry's own fields).
    if isinstance(value, _Pairs):
        return {name: _as_object(item) for name, item in value}
    if isinstance(value, list):
        return [_as_object(item) for item in value]
    return value


def parse_api_keys(text: str) -> list[tuple[bytes, str | None, KeyEntry]]:
    """The entries of `TOOLLOOP_API_KEYS`: (the key's SHA-256, the key when it was not given as its hash,
    its entry).

    `ApiKeysError` naming the setting and the entry (by position and tenant, never by key) when the text is
    not a JSON object of entries, a key is blank or a malformed `sha256:` hash, or one key comes twice."""
    try:
        # As pairs: JSON lets a name come twice, and a dict keeps the last, so a merged configuration that
        # repeats a key would silently give it the later entry's tenant and scopes.
        table = json.loads(text, object_pairs_hook=_Pairs)
    except ValueError as exc:
        raise ApiKeysError(f"{SETTING} is not valid JSON: {exc}") from None
    if not isinstance(table, _Pairs):
        raise ApiKeysError(f"{SETTING} must be a JSON object mapping each API key to its entry")
    parsed: list[tuple[bytes, str | None, KeyEntry]] = []
    for position, (key, raw_pairs) in enumerate(table, start=1):
        raw = _as_object(raw_pairs)
        tenant = raw.get("tenant") if isinstance(raw, dict) else None
        where = f"{SETTING}, entry {position}" + (f" (tenant {tenant!r})" if isinstance(tenant, str) else "")
        try:
            entry = KeyEntry.model_validate(raw)
        except ValidationError as exc:
            raise ApiKeysError(f"{where}: {_describe(exc)}") from None
        if key.startswith(HASH_PREFIX):
            hex_digest = key[len(HASH_PREFIX) :].lower()
            if not _HEX_DIGEST.match(hex_digest):
                raise ApiKeysError(f"{where}: a hashed key is 'sha256:' and 64 hexadecimal digits")
            digest, plain = bytes.fromhex(hex_digest), None
        elif not key.strip() or key != key.strip():
            raise ApiKeysError(f"{where}: a key is not blank, nor starts or ends with a space")
        else:
            digest, plain = build_digest(key), key
        if any(hmac.compare_digest(digest, seen) for seen, _, _ in parsed):
            raise ApiKeysError(f"{where}: the same key as an earlier entry (as itself or its hash)")
        parsed.append((digest, plain, entry))
    return parsed


def build_session_secret(settings: Settings) -> bytes:
    """What the page sessions of keys given by their hash are signed with: the token, else a random secret."""
    if settings.api_token is not None:
        return settings.api_token.get_secret_value().encode()
    return secrets.token_bytes(32)


class Access:
    """The API's callers, from its settings: who a bearer token or a page session is."""

    def __init__(self, token: bytes | None, keys: Sequence[ApiKey]) -> None:
        self.token = token
        self.keys = tuple(keys)
        self.token_session = build_session_value(token) if token is not None else None
        # The tenants the per-tenant metrics are labelled with: bounded by the configuration.
        self.tenants = frozenset({DEFAULT_TENANT, *(key.caller.tenant for key in self.keys)})

    @classmethod
    def from_settings(cls, settings: Settings) -> Access:
        """The callers of `settings` (`ApiKeysError` for a `TOOLLOOP_API_KEYS` that cannot be used)."""
        token = settings.api_token.get_secret_value().encode() if settings.api_token else None
        if settings.api_keys is None:
            return cls(token, [])
        session_secret = build_session_secret(settings)
        keys: list[ApiKey] = []
        for digest, plain, entry in parse_api_keys(settings.api_keys.get_secret_value()):
            caller = Caller(
                entry.tenant,
                frozenset(entry.scopes),
                frozenset(entry.tools) if entry.tools is not None else None,
                entry.name,
            )
            if plain is None:
                session = hmac.new(session_secret, b"sha256:" + digest, hashlib.sha256).hexdigest()
            else:
                session = build_session_value(plain.encode())
            keys.append(ApiKey(digest, caller, session))
        return cls(token, keys)

    @property
    def open(self) -> bool:
        """True when the API has neither a token nor keys: every request is the admin's."""
        return self.token is None and not self.keys

    def find_bearer(self, given: str) -> Caller | None:
        """The caller whose key (or the token) `given` is; None for none. Every key is compared, each in
        constant time, whichever matches."""
        found: Caller | None = None
        if self.token is not None and hmac.compare_digest(given.encode(), self.token):
            found = ADMIN
        digest = build_digest(given)
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key.caller
        return found

    def find_session(self, value: str) -> Caller | None:
        """The caller whose page session `value` is; None for none (compared as `find_bearer` does)."""
        found: Caller | None = None
        given = value.encode()
        if self.token_session is not None and hmac.compare_digest(given, self.token_session.encode()):
            found = ADMIN
        for key in self.keys:
            if hmac.compare_digest(given, key.session.encode()) and found is None:
                found = key.caller
        return found

    def find_sign_in(self, given: str) -> str | None:
        """The page session value of the key (or the token) `given`; None when it is neither."""
        if self.token is not None and hmac.compare_digest(given.encode(), self.token):
            return self.token_session
        digest = build_digest(given)
        session: str | None = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and session is None:
                session = key.session
        return session

    def build_tenant_label(self, tenant: str) -> str:
        """`tenant` as the per-tenant metrics label it: itself when a key (or the default) has it."""
        return tenant if tenant in self.tenants else OTHER_TENANTS


def find_caller(request: Request, bearer: str | None) -> Caller | None:
    """The request's caller: by its bearer token, else by its page session for a read, or for a write when
    it carries the session's CSRF token (`CSRF_HEADER`; which writes a session may do, `require` says);
    None for none."""
    access: Access = request.app.state.access
    if access.open:
        return ADMIN
    caller = access.find_bearer(bearer.strip()) if bearer is not None else None
    cookie = request.cookies.get(SESSION_COOKIE)
    if caller is not None or not cookie:
        return caller
    if request.method not in READ_METHODS:
        given = request.headers.get(CSRF_HEADER, "").encode()
        if not hmac.compare_digest(given, build_csrf_token(cookie).encode()):
            return None
    found = access.find_session(cookie)
    return dataclasses.replace(found, page_session=True) if found is not None else None


def _unauthenticated() -> HTTPException:
    return HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


async def authenticate(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]
) -> Caller:
    """The request's caller: by its bearer token, or its page session (`find_caller`); 401 without either.
    The schema declares the token as the HTTP bearer scheme `bearerToken` (`BEARER`)."""
    caller = find_caller(request, credentials.credentials if credentials is not None else None)
    if caller is None:
        raise _unauthenticated()
    return caller


def require(scope: Scope, *, page_writes: bool = False) -> Callable[..., Awaitable[Caller]]:
    """A dependency answering the caller when it has `scope`, else a 403. A page's session writes only
    where `page_writes` says it may (an approval from the turn page); elsewhere a write needs a bearer
    token (401)."""

    async def check(request: Request, caller: Annotated[Caller, Depends(authenticate)]) -> Caller:
        if caller.page_session and request.method not in READ_METHODS and not page_writes:
            raise _unauthenticated()
        if not caller.can(scope):
            raise HTTPException(403, f"this API key lacks the {scope!r} scope")
        return caller

    return check


def require_turn(scope: Scope, *, page_writes: bool = False) -> Callable[..., Awaitable[Caller]]:
    """A dependency for a route of one turn (`turn_id` in its path): the caller when it has `scope` and the
    turn is its tenant's; a 404 as for an unknown turn when it is another tenant's (or unknown). With
    `page_writes`, a page's session may write (`require`)."""

    # A default, not an annotation: annotations are text (PEP 563), resolved in the module, without `scope`.
    scoped = Depends(require(scope, page_writes=page_writes))

    async def check(turn_id: str, request: Request, caller: Caller = scoped) -> Caller:
        if caller.every_tenant:
            return caller
        stored = await request.app.state.redis.client.store.load_request(turn_id)
        if stored is None or not caller.sees(stored.tenant):
            raise HTTPException(404, f"unknown turn {turn_id!r}")
        return caller

    return check


def build_tenant(caller: Caller, given: str | None) -> str:
    """The tenant of what `caller` submits: `given` when it may submit for it (its own, or any for the
    admin), its own when none is given; a 403 for another tenant's."""
    if given is None:
        return caller.tenant
    if not caller.sees(given):
        raise HTTPException(403, f"this API key submits for tenant {caller.tenant!r} only")
    return given


def find_tool_refusals(
    caller: Caller, named: Sequence[str], catalogue: Mapping[str, ToolSpec]
) -> list[dict[str, Any]]:
    """The tools of `named` (a turn's `tools`, a direct call's one) that `caller` may not use, each as a 422
    detail item naming it (`loc` its index): outside the key's `tools`, or sensitive for a key without
    `tools`, refused as an unknown tool is (its `available` the tools the key may use)."""
    if caller.tools is None and caller.every_tenant:
        return []
    available = [spec.name for spec in build_key_listing(caller, catalogue.values())]
    refusals: list[dict[str, Any]] = []
    for index, name in enumerate(named):
        allowed = name in caller.tools if caller.tools is not None else not _is_sensitive(name, catalogue)
        if allowed:
            continue
        if caller.tools is not None:
            kind, message = "tool_not_allowed", f"tool {name!r} is not one of this API key's tools"
        else:
            kind, message = "unknown_tool", f"unknown tool {name!r}"
        refusals.append(
            {
                "type": kind,
                "loc": ["body", "tools", index],
                "msg": f"{message}; available: {', '.join(available) or 'none'}",
                "ctx": {"tool": name, "available": available},
            }
        )
    return refusals


def _is_sensitive(name: str, catalogue: Mapping[str, ToolSpec]) -> bool:
    spec = catalogue.get(name)
    return spec is not None and spec.sensitive


def build_key_listing(
    caller: Caller, specs: Iterable[ToolSpec], *, include_sensitive: bool = False
) -> list[ToolSpec]:
    """The tools `caller` may use, sorted by name: a key's `tools` (sensitive ones included, as it names
    them); without, the public ones (and the sensitive ones for the admin, when asked)."""
    if caller.tools is not None:
        return build_listing(specs, include_sensitive=True, allowlist=caller.tools)
    return build_listing(specs, include_sensitive=include_sensitive and caller.every_tenant)


def build_default_tools(caller: Caller, catalogue: Mapping[str, ToolSpec]) -> list[str] | None:
    """The tools a turn that names none offers: every public tool (None) for a key without `tools`, else
    its public tools that a worker serves (a sensitive tool only when the turn names it)."""
    if caller.tools is None:
        return None
    return [spec.name for spec in build_listing(catalogue.values(), allowlist=caller.tools)]
