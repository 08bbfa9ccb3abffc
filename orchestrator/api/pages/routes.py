"""The routes of the turn pages: `/ui`, `/ui/turns/{id}`, their static files, and `GET /v1/turns`.

The pages are static HTML (`static/`); the turn page gets its turn id and the Flower address as attributes,
HTML-escaped. Everything a page shows comes from the API it calls (`GET /v1/turns`, `GET /v1/turns/{id}`,
`GET /v1/turns/{id}/events`) and is inserted as text, never as HTML: a tool's result may hold HTML. A
Content-Security-Policy allows nothing but this server's own scripts, styles and connections.

With a token or keys set, a page answers 401 with a short explanation unless it gets a key once (`?token=`,
then a session cookie and a redirect without it, `orchestrator.api.pages.auth`), the cookie, or the bearer
header. What a page then shows is what its key may read (`GET /v1/turns` lists the key's tenant's turns).
The static files hold no data and are served to anyone.
"""

from __future__ import annotations

from html import escape
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel

from orchestrator.api.access import Access, Caller, require
from orchestrator.api.connections import ApiRedis
from orchestrator.api.pages.auth import READ_METHODS, SESSION_COOKIE
from orchestrator.settings import Settings
from orchestrator.store import codec
from orchestrator.store.recent import DEFAULT_LIMIT, MAX_LIMIT, RecentCache, RecentTurn, alist_recent
from workers.contract import TENANT_PATTERN

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
<body><h1>401: this page needs an API key</h1>
<p>This toolloop API is protected by <code>TOOLLOOP_API_KEYS</code> or <code>TOOLLOOP_API_TOKEN</code>.
Open this page once as <code>{path}?token=&lt;your key&gt;</code>: the page then keeps a session cookie (for
reading only) and takes the key out of the address.</p>
<p>{reason}</p></body></html>
"""


class RecentTurns(BaseModel):
    """What `GET /v1/turns` answers: the recent turns, newest first."""

    turns: list[RecentTurn]


def build_listing_router() -> APIRouter:
    """`GET /v1/turns?limit=N&tenant=T`: the recent turns (`store.recent`); the app adds auth and a pool
    slot."""
    router = APIRouter()
    cache = RecentCache()  # what this process's listings have read: the next one reads only what is new

    @router.get(
        "/v1/turns", response_model=RecentTurns, operation_id="listTurns", summary="List recent turns"
    )
    async def list_turns(
        request: Request,
        caller: Annotated[Caller, Depends(require("read"))],
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
        tenant: Annotated[str | None, Query(pattern=TENANT_PATTERN)] = None,
    ) -> RecentTurns:
        """The most recent turns, newest first: tenant, status, model, times, duration and the tools used;
        of one `tenant` when given. A key lists its own tenant's only (another `tenant` is a 403)."""
        if not caller.every_tenant:
            if tenant is not None and tenant != caller.tenant:
                raise HTTPException(403, f"this API key reads tenant {caller.tenant!r} only")
            tenant = caller.tenant
        api: ApiRedis = request.app.state.redis
        return RecentTurns(turns=await alist_recent(api.client.store.redis, limit, cache, tenant))

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


def _signed_in(request: Request, session: str) -> Response:
    # The key is right: a session cookie, and the same page again without the key in its address.
    target = request.url.remove_query_params("token")
    location = target.path + (f"?{target.query}" if target.query else "")
    response = RedirectResponse(location, status_code=303, headers=PAGE_HEADERS)
    response.set_cookie(
        SESSION_COOKIE,
        session,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


def check_page(request: Request, access: Access) -> Response | None:
    """The check every page passes: None to serve it, else what to answer instead (a 401, or the sign-in
    redirect of a right `?token=`)."""
    if access.open:
        return None
    given = request.query_params.get("token")
    if given is not None:
        session = access.find_sign_in(given.strip())
        if session is None:
            return _refusal(request, "The key given is not one of the API's keys.")
        return _signed_in(request, session)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and request.method in READ_METHODS and access.find_session(cookie) is not None:
        return None
    scheme, _, bearer = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and access.find_bearer(bearer.strip()) is not None:
        return None
    return _refusal(request, "No session yet (or it belongs to an older key).")


def build_pages_router(settings: Settings) -> APIRouter:
    """`/ui`, `/ui/turns/{id}` and `/ui/static/{name}`."""
    router = APIRouter(include_in_schema=False)
    flower_url = build_flower_url(settings.flower_url)

    @router.get("/ui")
    async def turns_page(request: Request) -> Response:
        page = HTMLResponse(read_static("turns.html"), headers=PAGE_HEADERS)
        return check_page(request, request.app.state.access) or page

    @router.get("/ui/turns/{turn_id}")
    async def turn_page(turn_id: str, request: Request) -> Response:
        refused = check_page(request, request.app.state.access)
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
