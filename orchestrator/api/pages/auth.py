"""The pages' session when the API has a token or keys: a browser's EventSource cannot send an
`Authorization` header, so a person signs in once with a form (`/ui/session`) that POSTs the key (an API
key, or the token); the API checks it and sets an HttpOnly, SameSite=Strict cookie. The key never travels in
an address: a page opened with `?token=` is sent to the form instead, and the access log shows the value as
`***` (`TokenRedactingFilter`), since what sits in a URL ends in logs, histories and `Referer`s.

The cookie holds an HMAC of the key, not the key: what a browser keeps (or a cookie jar leaks) is no bearer
token for the API. The API maps it back to its key (`orchestrator.api.access.Access.find_session`), so a
session sees what its key sees: its tenant's turns only, every tenant's for the admin. It is good until the
key changes, and for reads (`GET`, `HEAD`); its one write is an approval from the turn page, which must
carry the session's CSRF token (`build_csrf_token`, an HMAC of the session value: double submit, in the
page and in the `X-Toolloop-CSRF` header) that another site's page can neither read nor send. Submits and
cancels stay bearer-only, so a page session cannot be made to do them by another site.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from urllib.parse import urlsplit

SESSION_COOKIE = "toolloop_session"
# The methods a page session may use: the pages, the turn listing, a turn's view and its events.
READ_METHODS = frozenset({"GET", "HEAD"})
# The query parameter pages once took a key from: refused now, and redacted in the access log.
TOKEN_PARAMETER = "token"
# The header a page's write carries its session's CSRF token in.
CSRF_HEADER = "X-Toolloop-CSRF"
_SESSION_LABEL = b"toolloop ui session v1"
_CSRF_LABEL = b"toolloop ui csrf v1"
_TOKEN_IN_QUERY = re.compile(r"([?&]token=)[^&#\s]*", re.IGNORECASE)
_UI_PATH = re.compile(r"^/ui(/[A-Za-z0-9_./:-]*)?$")


def build_session_value(key: bytes) -> str:
    """The cookie's value for this key (or token)."""
    return hmac.new(key, _SESSION_LABEL, hashlib.sha256).hexdigest()


def build_csrf_token(session: str) -> str:
    """The CSRF token of a page session: derived from its (HttpOnly, secret) value, so it needs no store,
    and telling nothing of it."""
    return hmac.new(session.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def build_redacted_path(path: str) -> str:
    """`path` (with its query) with the value of every `token=` parameter written `***`."""
    return _TOKEN_IN_QUERY.sub(r"\1***", path)


def build_next_path(given: str | None) -> str:
    """Where the sign-in form sends a person once signed in: `given` when it is a page of this server
    (`/ui`, `/ui/...`, no scheme, host or query: nothing to bounce a person elsewhere), else `/ui`."""
    if not given or urlsplit(given).netloc or not _UI_PATH.match(given) or ".." in given:
        return "/ui"
    return given


class TokenRedactingFilter(logging.Filter):
    """Writes `token=***` in uvicorn's access log lines (their third argument is the path with its query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], build_redacted_path(args[2]), *args[3:])
        return True


def install_access_log_filter(logger_name: str = "uvicorn.access") -> None:
    """Add `TokenRedactingFilter` to the access log, once however often it is called."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, TokenRedactingFilter) for f in logger.filters):
        logger.addFilter(TokenRedactingFilter())
