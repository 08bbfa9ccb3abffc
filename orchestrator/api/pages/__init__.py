"""The turn pages `toolloop api` serves (issue 14): `/ui` lists the recent turns, `/ui/turns/{id}` shows one
live over its SSE stream. Plain HTML and a little JavaScript in `static/`, no build step, nothing loaded from
elsewhere.

    auth     the page session: a sign-in form's key, then an HttpOnly cookie the API accepts for reads
    routes   the pages, their static files, and `GET /v1/turns` (the recent turns, `store.recent`)
"""
