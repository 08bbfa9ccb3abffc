"""TOOLLOOP_API_KEYS as the API reads it (`api.access`): the table's parsing and its errors, keys found by
themselves or their hash, page sessions per key, and the rules of tenants and tools, as tables."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from fastapi import HTTPException
from pydantic import SecretStr

from orchestrator.api.access import ADMIN, Access, Caller, build_tenant, find_tool_refusals, parse_api_keys
from orchestrator.api.pages.auth import build_session_value
from orchestrator.errors import ApiKeysError
from orchestrator.settings import Settings
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(10)

ACME = {"tenant": "acme", "scopes": ["submit", "read"]}


def settings(keys: dict[str, Any] | None, token: str | None = None) -> Settings:
    return Settings(
        api_keys=SecretStr(json.dumps(keys)) if keys is not None else None,
        api_token=SecretStr(token) if token else None,
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"k": ', "TOOLLOOP_API_KEYS is not valid JSON: "),
        ('["k"]', "TOOLLOOP_API_KEYS must be a JSON object"),
        ('{"k": {"tenant": "acme"}}', "TOOLLOOP_API_KEYS, entry 1 (tenant 'acme'): scopes: Field required"),
        ('{"k": {"tenant": "acme", "scopes": []}}', "entry 1 (tenant 'acme'): scopes: List should have"),
        ('{"k": {"tenant": "acme", "scopes": ["write"]}}', "scopes.0: Input should be 'submit', 'read'"),
        ('{"k": {"tenant": "a b", "scopes": ["read"]}}', "tenant: String should match pattern"),
        ('{"k": {"tenant": "acme", "scopes": ["read"], "role": "x"}}', "role: Extra inputs"),
        ('{"k": "acme"}', "TOOLLOOP_API_KEYS, entry 1: entry: Input should be a valid dictionary"),
        ('{" ": {"tenant": "acme", "scopes": ["read"]}}', "entry 1 (tenant 'acme'): a key is not blank"),
        ('{"sha256:abc": {"tenant": "acme", "scopes": ["read"]}}', "'sha256:' and 64 hexadecimal digits"),
    ],
)
def test_a_table_that_cannot_be_used_is_refused_naming_the_setting(text: str, says: str) -> None:
    with pytest.raises(ApiKeysError) as raised:
        parse_api_keys(text)
    assert says in str(raised.value)
    assert str(raised.value).startswith("TOOLLOOP_API_KEYS")


def test_the_same_key_twice_is_refused_and_no_error_shows_a_key() -> None:
    digest = hashlib.sha256(b"secret-key-1").hexdigest()
    table = {"secret-key-1": ACME, f"sha256:{digest}": {"tenant": "globex", "scopes": ["read"]}}
    with pytest.raises(ApiKeysError, match=r"entry 2 \(tenant 'globex'\): the same key") as raised:
        parse_api_keys(json.dumps(table))
    assert "secret-key-1" not in str(raised.value)


def test_a_key_written_twice_is_refused_not_given_the_later_entry() -> None:
    # JSON lets a name come twice and a dict keeps the last: a merged configuration raised a key's rights.
    text = '{"k1": {"tenant": "acme", "scopes": ["read"]}, "k1": {"tenant": "globex", "scopes": ["admin"]}}'
    with pytest.raises(ApiKeysError, match=r"entry 2 \(tenant 'globex'\): the same key"):
        parse_api_keys(text)
    for not_an_object in ("[]", '[["k1", {}]]', '"k1"'):
        with pytest.raises(ApiKeysError, match="must be a JSON object"):
            parse_api_keys(not_an_object)


def test_the_admin_scope_is_every_scope() -> None:
    admin_only = Caller("ops", frozenset({"admin"}))
    assert all(admin_only.can(scope) for scope in ("submit", "read", "approve", "cancel", "admin"))
    assert not Caller("ops", frozenset({"read"})).can("submit")


def test_a_key_is_found_by_itself_or_its_hash_and_the_token_is_the_admin() -> None:
    digest = hashlib.sha256(b"globex-key").hexdigest()
    table = {
        "acme-key": ACME,
        f"sha256:{digest.upper()}": {"tenant": "globex", "scopes": ["read"], "tools": []},
    }
    access = Access.from_settings(settings(table, token="admin-token"))
    acme, globex = access.find_bearer("acme-key"), access.find_bearer("globex-key")
    assert acme == Caller("acme", frozenset({"submit", "read"}))
    assert globex == Caller("globex", frozenset({"read"}), frozenset())
    assert access.find_bearer("admin-token") is ADMIN
    assert access.find_bearer(f"sha256:{digest}") is None  # the hash is no key
    assert access.find_bearer("acme-key ") is None and access.find_bearer("") is None
    assert access.tenants == {"default", "acme", "globex"}
    assert (access.build_tenant_label("acme"), access.build_tenant_label("initech")) == ("acme", "other")


def test_page_sessions_are_per_key_and_map_back_to_it() -> None:
    digest = hashlib.sha256(b"globex-key").hexdigest()
    table = {"acme-key": ACME, f"sha256:{digest}": {"tenant": "globex", "scopes": ["read"]}}
    access = Access.from_settings(settings(table, token="admin-token"))
    acme_session = access.find_sign_in("acme-key")
    globex_session = access.find_sign_in("globex-key")
    assert acme_session == build_session_value(b"acme-key")  # an HMAC of the key
    assert globex_session is not None and digest not in globex_session
    assert access.find_session(acme_session).tenant == "acme"  # type: ignore[union-attr]
    assert access.find_session(globex_session).tenant == "globex"  # type: ignore[union-attr]
    assert access.find_session(build_session_value(b"admin-token")) is ADMIN
    assert access.find_sign_in("nobody") is None and access.find_session("0" * 64) is None
    # Signed with the token, a hashed key's session is the same in every API process.
    again = Access.from_settings(settings(table, token="admin-token"))
    assert again.find_sign_in("globex-key") == globex_session


def test_without_keys_or_token_the_api_is_open() -> None:
    assert Access.from_settings(settings(None)).open
    assert not Access.from_settings(settings({}, token="t")).open
    assert Access.from_settings(Settings(api_keys=SecretStr("  "))).open  # blank is none


CATALOGUE = {
    "add": ToolSpec(name="add"),
    "echo": ToolSpec(name="echo"),
    "refund": ToolSpec(name="refund", sensitive=True),
}
PUBLIC_KEY = Caller("acme", frozenset({"submit"}))
LISTED_KEY = Caller("globex", frozenset({"submit"}), frozenset({"add", "refund"}))
ADMIN_KEY = Caller("ops", frozenset({"submit", "admin"}))


@pytest.mark.parametrize(
    ("caller", "named", "refused"),
    [
        (PUBLIC_KEY, ["add", "echo"], []),
        (PUBLIC_KEY, ["add", "refund"], [("unknown_tool", 1, "refund", ["add", "echo"])]),
        (LISTED_KEY, ["add", "refund"], []),
        (
            LISTED_KEY,
            ["echo", "nope"],
            [
                ("tool_not_allowed", 0, "echo", ["add", "refund"]),
                ("tool_not_allowed", 1, "nope", ["add", "refund"]),
            ],
        ),
        (ADMIN, ["refund", "nope"], []),
        (ADMIN_KEY, ["refund"], []),
    ],
)
def test_the_tools_a_key_may_use(
    caller: Caller, named: list[str], refused: list[tuple[str, int, str, list[str]]]
) -> None:
    found = find_tool_refusals(caller, named, CATALOGUE)
    assert [(r["type"], r["loc"][-1], r["ctx"]["tool"], r["ctx"]["available"]) for r in found] == refused
    assert all(r["ctx"]["tool"] in r["msg"] for r in found)


@pytest.mark.parametrize(
    ("caller", "given", "tenant"),
    [(PUBLIC_KEY, None, "acme"), (PUBLIC_KEY, "acme", "acme"), (ADMIN, None, "default"), (ADMIN, "x", "x")],
)
def test_the_tenant_of_a_submit(caller: Caller, given: str | None, tenant: str) -> None:
    assert build_tenant(caller, given) == tenant


def test_a_key_submits_for_no_other_tenant() -> None:
    with pytest.raises(HTTPException) as raised:
        build_tenant(PUBLIC_KEY, "globex")
    assert raised.value.status_code == 403
