"""The pages' session when `TOOLLOOP_API_TOKEN` is set: a browser's EventSource cannot send an
`Authorization` header, so a person opens a page once with `?token=<token>`; the page checks it, sets an
HttpOnly, SameSite=Strict cookie and redirects to itself without the token in the URL.

The cookie holds an HMAC of the token, not the token: what a browser keeps (or a cookie jar leaks) is no
bearer token for the API. It is good until the token changes, and for reads only (`GET`, `HEAD`): the API's
auth dependency (`orchestrator.api.app.build_auth_dependency`) accepts it for them, never for a submit, a
cancel or an approval, so a page session cannot be made to write by another site.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request

SESSION_COOKIE = "toolloop_session"
# The methods a page session may use: the pages, the turn listing, a turn's view and its events.
READ_METHODS = frozenset({"GET", "HEAD"})
_SESSION_LABEL = b"toolloop ui session v1"


def build_session_value(token: bytes) -> str:
    """The cookie's value for this token."""
    return hmac.new(token, _SESSION_LABEL, hashlib.sha256).hexdigest()


def has_session(request: Request, token: bytes) -> bool:
    """True for a read carrying the session cookie of `token` (compared in constant time)."""
    given = request.cookies.get(SESSION_COOKIE)
    if request.method not in READ_METHODS or not given:
        return False
    return hmac.compare_digest(given.encode(), build_session_value(token).encode())


def has_bearer(authorization: str | None, token: bytes) -> bool:
    """True for `Authorization: Bearer <token>` (compared in constant time)."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)
