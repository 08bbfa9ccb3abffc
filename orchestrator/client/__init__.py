"""What a web app holds: the clients that submit turns, read them and act on them.

    redis_client  `Client` / `AsyncClient`, straight on Redis (the fastest path; needs Redis credentials)
    http_client   `HttpClient` / `AsyncHttpClient`, over the HTTP API (no Redis access needed)
    submission    a turn's request, built once from the arguments every client takes
    direct        a tool called without a model (`call_tool`), published as the runtime publishes a round

`from orchestrator import Client` (or any of the four) is the usual import.
"""
