"""The routes of the turn pages: `/ui`, `/ui/turns/{id}`, their static files, and `GET /v1/turns`.

The pages are static HTML (`static/`); the turn page gets its turn id and the Flower address as attributes,
HTML-escaped. Everything a page shows comes from the API it calls (`GET /v1/turns`, `GET /v1/turns/{id}`,
`GET /v1/turns/{id}/events`) and is inserted as text, never as HTML: a tool's result may hold HTML. A
Content-Security-Policy allows nothing but this server's own scripts, styles and connections.

With a token set, a page answers 401 with a short explanation unless it gets the token once (`?token=`, then
a session cookie and a redirect without it, `orchestrator.api.pages.auth`), the cookie, or the bearer header.
The static files hold no data and are served to anyone.
"""

from __future__ import annotations

import hmac
from html import escape
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel

from orchestrator.api.connections import ApiRedis
from orchestrator.api.pages.auth import SESSION_COOKIE, build_session_value, has_bearer, has_session
from orchestrator.settings import Settings
from orchestrator.store import codec
from orchestrator.store.recent import DEFAULT_LIMIT, MAX_LIMIT, RecentCache, RecentTurn, alist_recent

_STATIC = resources.files("orchestrator.api.pages").joinpath("static")
# The files under /ui/static/, and their media types: nothing else is served from there.
STATIC_FILES = {
    "ui.css": "text/css; charset=utf-8",
    "turns.js": "text/javascript; charset=utf-8",
    "turn.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
REFUSAL = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>toolloop: token needed</title></head>
<body><h1>401: this page needs the API token</h1>
<p>This toolloop API is protected by <code>TOOLLOOP_API_TOKEN</code>. Open this page once as
<code>{path}?token=&lt;the token&gt;</code>: the page then keeps a session cookie (for reading only) and
takes the token out of the address.</p>
<p>{reason}</p></body></html>
"""


class RecentTurns(BaseModel):
    """What `GET /v1/turns` answers: the recent turns, newest first."""

    turns: list[RecentTurn]


def build_listing_router() -> APIRouter:
    """`GET /v1/turns?limit=N`: the recent turns (`store.recent`); the app adds auth and a pool slot."""
    router = APIRouter()
    cache = RecentCache()  # what this process's listings have read: the next one reads only what is new

    @router.get(
        "/v1/turns", response_model=RecentTurns, operation_id="listTurns", summary="List recent turns"
    )
    async def list_turns(
        request: Request, limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT
    ) -> RecentTurns:
        """The most recent turns, newest first: status, model, times, duration and the tools used."""
        api: ApiRedis = request.app.state.redis
        return RecentTurns(turns=await alist_recent(api.client.store.redis, limit, cache))

    return router


def read_static(name: str) -> str:
    """The text of one file of `static/`."""
    return _STATIC.joinpath(name).read_text(encoding="utf-8")


def build_flower_url(url: str | None) -> str:
    """The Flower address the turn page links to: an http(s) URL without its trailing slash, else ""."""
    if not url or not url.startswith(("http://", "https://")):
        return ""
    return url.rstrip("/")


def build_turn_page(turn_id: str, flower_url: str) -> str:
    """The turn page, its turn id and Flower address escaped into attributes."""
    page = read_static("turn.html")
    page = page.replace("{{turn_id}}", escape(turn_id, quote=True))
    return page.replace("{{flower_url}}", escape(flower_url, quote=True))


def _refusal(request: Request, reason: str) -> HTMLResponse:
    body = REFUSAL.format(path=escape(request.url.path), reason=escape(reason))
    return HTMLResponse(body, status_code=401, headers={**PAGE_HEADERS, "WWW-Authenticate": "Bearer"})


def _signed_in(request: Request, token: bytes) -> Response:
    # The token is right: a session cookie, and the same page again without the token in its address.
    target = request.url.remove_query_params("token")
    location = target.path + (f"?{target.query}" if target.query else "")
    response = RedirectResponse(location, status_code=303, headers=PAGE_HEADERS)
    response.set_cookie(
        SESSION_COOKIE,
        build_session_value(token),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


def check_page(request: Request, token: bytes | None) -> Response | None:
    """The check every page passes: None to serve it, else what to answer instead (a 401, or the sign-in
    redirect of a right `?token=`)."""
    if token is None:
        return None
    given = request.query_params.get("token")
    if given is not None:
        if not hmac.compare_digest(given.encode(), token):
            return _refusal(request, "The token given is not the API's token.")
        return _signed_in(request, token)
    if has_session(request, token) or has_bearer(request.headers.get("authorization"), token):
        return None
    return _refusal(request, "No session yet (or it belongs to an older token).")


def build_pages_router(settings: Settings) -> APIRouter:
    """`/ui`, `/ui/turns/{id}` and `/ui/static/{name}`."""
    router = APIRouter(include_in_schema=False)
    token = settings.api_token.get_secret_value().encode() if settings.api_token else None
    flower_url = build_flower_url(settings.flower_url)

    @router.get("/ui")
    async def turns_page(request: Request) -> Response:
        return check_page(request, token) or HTMLResponse(read_static("turns.html"), headers=PAGE_HEADERS)

    @router.get("/ui/turns/{turn_id}")
    async def turn_page(turn_id: str, request: Request) -> Response:
        refused = check_page(request, token)
        if refused is not None:
            return refused
        try:
            codec.validate_turn_id(turn_id)
        except ValueError:
            raise HTTPException(404, "not a turn id") from None
        return HTMLResponse(build_turn_page(turn_id, flower_url), headers=PAGE_HEADERS)

    @router.get("/ui/static/{name}")
    async def static_file(name: str) -> Response:
        media_type = STATIC_FILES.get(name)
        if media_type is None:
            raise HTTPException(404, "no such file")
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
        return Response(read_static(name), media_type=media_type, headers=headers)

    return router
