"""The pages' session when the API has a token or keys: a browser's EventSource cannot send an
`Authorization` header, so a person opens a page once with `?token=<key>` (an API key, or the token); the
page checks it, sets an HttpOnly, SameSite=Strict cookie and redirects to itself without the key in the URL.

The cookie holds an HMAC of the key, not the key: what a browser keeps (or a cookie jar leaks) is no bearer
token for the API. The API maps it back to its key (`orchestrator.api.access.Access.find_session`), so a
session sees what its key sees: its tenant's turns only, every tenant's for the admin. It is good until the
key changes, and for reads only (`GET`, `HEAD`): the API accepts it for them, never for a submit, a cancel
or an approval, so a page session cannot be made to write by another site.
"""

from __future__ import annotations

import hashlib
import hmac

SESSION_COOKIE = "toolloop_session"
# The methods a page session may use: the pages, the turn listing, a turn's view and its events.
READ_METHODS = frozenset({"GET", "HEAD"})
_SESSION_LABEL = b"toolloop ui session v1"


def build_session_value(key: bytes) -> str:
    """The cookie's value for this key (or token)."""
    return hmac.new(key, _SESSION_LABEL, hashlib.sha256).hexdigest()
