"""The routes of the turn pages: `/ui`, `/ui/turns/{id}`, their static files, and `GET /v1/turns`.

The pages are static HTML (`static/`); the turn page gets its turn id and the Flower address as attributes,
HTML-escaped. Everything a page shows comes from the API it calls (`GET /v1/turns`, `GET /v1/turns/{id}`,
`GET /v1/turns/{id}/events`) and is inserted as text, never as HTML: a tool's result may hold HTML. A
Content-Security-Policy allows nothing but this server's own scripts, styles and connections.

With a token or keys set, a page answers 401 with the sign-in form unless it gets the session cookie or
the bearer header. The form (`GET /ui/session`) POSTs the key (`POST /ui/session`, field `key`), which sets
the cookie and goes back to the page; `POST /ui/session/end` signs out. A page opened with `?token=` (how
keys were once given) is sent to the form, saying why, with the key out of the address
(`orchestrator.api.pages.auth`). What a page then shows is what its key may read (`GET /v1/turns` lists the
key's tenant's turns).
The static files hold no data and are served to anyone.
"""

from __future__ import annotations

from html import escape
from importlib import resources
from typing import Annotated
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel

from orchestrator.api.access import Access, Caller, require
from orchestrator.api.connections import ApiRedis
from orchestrator.api.pages.auth import (
    READ_METHODS,
    SESSION_COOKIE,
    TOKEN_PARAMETER,
    build_csrf_token,
    build_next_path,
    install_access_log_filter,
)
from orchestrator.model import TurnStatus
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
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
# What the sign-in form says, by the `why` of its address (a fixed text: nothing given is echoed).
NOTICES = {
    "token-in-url": (
        "Keys are no longer taken from the address (?token=): an address is written to logs and histories. "
        "Sign in here instead; the key you put in the address may have been logged, so consider changing it."
    ),
    "wrong-key": "The key given is not one of the API's keys.",
    "signed-out": "Signed out.",
    "no-session": "No session yet (or it belongs to an older key): sign in.",
}
# The largest sign-in form body read: a key and a page's path.
MAX_FORM_BYTES = 8192


class RecentTurns(BaseModel):
    """What `GET /v1/turns` answers: the recent turns, newest first."""

    turns: list[RecentTurn]


def build_listing_router() -> APIRouter:
    """`GET /v1/turns?limit=N&tenant=T&status=S&model=M`: the recent turns (`store.recent`); the app adds
    auth and a pool slot."""
    router = APIRouter()
    cache = RecentCache()  # what this process's listings have read: the next one reads only what is new

    @router.get(
        "/v1/turns", response_model=RecentTurns, operation_id="listTurns", summary="List recent turns"
    )
    async def list_turns(
        request: Request,
        *,
        caller: Annotated[Caller, Depends(require("read"))],
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
        tenant: Annotated[str | None, Query(pattern=TENANT_PATTERN)] = None,
        status: TurnStatus | None = None,
        model: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    ) -> RecentTurns:
        """The most recent turns, newest first: tenant, status, model, times, duration and the tools used;
        only those of one `tenant`, with one `status`, of one `model` (the model that ran it), when given.
        A key lists its own tenant's only (another `tenant` is a 403)."""
        if not caller.every_tenant:
            if tenant is not None and tenant != caller.tenant:
                raise HTTPException(403, f"this API key reads tenant {caller.tenant!r} only")
            tenant = caller.tenant
        api: ApiRedis = request.app.state.redis
        redis = api.client.store.redis
        turns = await alist_recent(redis, limit, cache, tenant, status=status, model=model)
        return RecentTurns(turns=turns)

    return router


def read_static(name: str) -> str:
    """The text of one file of `static/`."""
    return _STATIC.joinpath(name).read_text(encoding="utf-8")


def build_flower_url(url: str | None) -> str:
    """The Flower address the turn page links to: an http(s) URL without its trailing slash, else ""."""
    if not url or not url.startswith(("http://", "https://")):
        return ""
    return url.rstrip("/")


# The sign-out button, on a page read through a session only: an open API and a bearer header have nothing
# to sign out of.
SIGN_OUT_FORM = (
    '<form method="post" action="/ui/session/end" class="sign-out">'
    '<button type="submit">Sign out</button></form>\n'
)


def find_page_session(request: Request, access: Access) -> tuple[str, Caller] | None:
    """The session a page is read through: its cookie and its key's caller; None for an open API, a bearer
    header or no live session."""
    cookie = request.cookies.get(SESSION_COOKIE)
    caller = access.find_session(cookie) if cookie and not access.open else None
    return (cookie, caller) if cookie and caller is not None else None


def build_sign_out(session: tuple[str, Caller] | None) -> str:
    """The sign-out form for a page read through a session (`find_page_session`), else ""."""
    return SIGN_OUT_FORM if session is not None else ""


def build_turns_page(sign_out: str = "") -> str:
    """The recent turns' page, with its sign-out form (`build_sign_out`) or none."""
    return read_static("turns.html").replace("{{sign_out}}", sign_out)


def build_turn_page(
    turn_id: str, flower_url: str, csrf_token: str = "", can_approve: bool = False, sign_out: str = ""
) -> str:
    """The turn page, its turn id, Flower address, CSRF token and whether its reader may approve escaped
    into attributes, with its sign-out form (`build_sign_out`) or none."""
    page = read_static("turn.html").replace("{{sign_out}}", sign_out)
    page = page.replace("{{turn_id}}", escape(turn_id, quote=True))
    page = page.replace("{{csrf_token}}", escape(csrf_token, quote=True))
    page = page.replace("{{can_approve}}", "true" if can_approve else "false")
    return page.replace("{{flower_url}}", escape(flower_url, quote=True))


def find_approver(access: Access, session: tuple[str, Caller] | None) -> tuple[str, bool]:
    """The turn page's CSRF token (its session's, `find_page_session`; "" without one) and whether its
    reader may approve from it: an open API's reader, or a session whose key has `approve` (a bearer header
    is no session a page's script can send again)."""
    if access.open:
        return "", True
    if session is None:
        return "", False
    cookie, caller = session
    return build_csrf_token(cookie), caller.can("approve")


def build_sign_in_page(next_path: str, why: str | None) -> str:
    """The sign-in form, going back to `next_path` once signed in, with the notice of `why` (`NOTICES`)."""
    page = read_static("signin.html").replace("{{next}}", escape(build_next_path(next_path), quote=True))
    return page.replace("{{notice}}", escape(NOTICES.get(why or "", "")))


def _sign_in_form(next_path: str, why: str, status_code: int) -> HTMLResponse:
    headers = {**PAGE_HEADERS, "WWW-Authenticate": "Bearer"} if status_code == 401 else PAGE_HEADERS
    return HTMLResponse(build_sign_in_page(next_path, why), status_code=status_code, headers=headers)


def _redirect(location: str) -> RedirectResponse:
    return RedirectResponse(location, status_code=303, headers=PAGE_HEADERS)


def build_page_path(request: Request) -> str:
    """The page's path and query, without any `token` parameter."""
    target = request.url.remove_query_params(TOKEN_PARAMETER)
    return target.path + (f"?{target.query}" if target.query else "")


def check_page(request: Request, access: Access) -> Response | None:
    """The check every page passes: None to serve it, else what to answer instead (the sign-in form, 401,
    or for an address holding `?token=` a redirect to the form that says why)."""
    if TOKEN_PARAMETER in request.query_params:
        if access.open:
            return _redirect(build_page_path(request))
        next_path = quote(build_next_path(urlsplit(build_page_path(request)).path), safe="/")
        return _redirect(f"/ui/session?why=token-in-url&next={next_path}")
    if access.open:
        return None
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and request.method in READ_METHODS and access.find_session(cookie) is not None:
        return None
    scheme, _, bearer = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and access.find_bearer(bearer.strip()) is not None:
        return None
    return _sign_in_form(request.url.path, "no-session", 401)


def is_same_origin(request: Request) -> bool:
    """False when a browser says the request comes from another site's page: by `Sec-Fetch-Site` when it
    sends one (every current browser), else by `Origin` (which is "null" under our `no-referrer` policy, so
    not enough alone). A request without either (a script, curl) is no forged form."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _set_session(response: Response, request: Request, session: str) -> None:
    secure = request.url.scheme == "https"
    response.set_cookie(SESSION_COOKIE, session, path="/", httponly=True, samesite="strict", secure=secure)


def build_session_router() -> APIRouter:
    """`GET /ui/session` (the form), `POST /ui/session` (sign in) and `POST /ui/session/end` (sign out)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/session")
    async def sign_in_form(request: Request) -> Response:
        if request.app.state.access.open:
            return _redirect("/ui")
        why = request.query_params.get("why")
        return _sign_in_form(request.query_params.get("next") or "/ui", why or "", 200)

    @router.post("/ui/session")
    async def sign_in(request: Request) -> Response:
        # The form's body is read here (two fields): no multipart parser is needed for it.
        if not is_same_origin(request):
            raise HTTPException(403, "a sign-in from another site")
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "the sign-in form is larger than it can be")
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
        next_path = build_next_path((fields.get("next") or ["/ui"])[0])
        access: Access = request.app.state.access
        if access.open:
            return _redirect(next_path)
        session = access.find_sign_in((fields.get("key") or [""])[0].strip())
        if session is None:
            return _sign_in_form(next_path, "wrong-key", 401)
        response = _redirect(next_path)
        _set_session(response, request, session)
        return response

    @router.post("/ui/session/end")
    async def sign_out(request: Request) -> Response:
        if not is_same_origin(request):
            raise HTTPException(403, "a sign-out from another site")
        response = _redirect("/ui/session?why=signed-out")
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    return router


def build_pages_router(settings: Settings) -> APIRouter:
    """`/ui`, `/ui/turns/{id}`, `/ui/static/{name}` and the session's routes (`build_session_router`)."""
    install_access_log_filter()
    router = APIRouter(include_in_schema=False)
    router.include_router(build_session_router())
    flower_url = build_flower_url(settings.flower_url)

    @router.get("/ui")
    async def turns_page(request: Request) -> Response:
        access: Access = request.app.state.access
        refused = check_page(request, access)
        if refused is not None:
            return refused
        sign_out = build_sign_out(find_page_session(request, access))
        return HTMLResponse(build_turns_page(sign_out), headers=PAGE_HEADERS)

    @router.get("/ui/turns/{turn_id}")
    async def turn_page(turn_id: str, request: Request) -> Response:
        refused = check_page(request, request.app.state.access)
        if refused is not None:
            return refused
        try:
            codec.validate_turn_id(turn_id)
        except ValueError:
            raise HTTPException(404, "not a turn id") from None
        access: Access = request.app.state.access
        session = find_page_session(request, access)
        csrf_token, can_approve = find_approver(access, session)
        page = build_turn_page(turn_id, flower_url, csrf_token, can_approve, build_sign_out(session))
        return HTMLResponse(page, headers=PAGE_HEADERS)

    @router.get("/ui/static/{name}")
    async def static_file(name: str) -> Response:
        media_type = STATIC_FILES.get(name)
        if media_type is None:
            raise HTTPException(404, "no such file")
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
        return Response(read_static(name), media_type=media_type, headers=headers)

    return router
