"""The HTTP face of toolloop (`toolloop api`): what a web app, a browser or a generated client reaches.

app          the FastAPI app: the `/v1` routes, their schemas, errors and the bearer scheme
connections  the API process's Redis clients (one per event loop) and their outage answers
fanout       one Redis reader per turn, shared by every SSE stream following it
sse          a turn's events as Server-Sent Events, resumable with `Last-Event-ID`
pages        the turn pages (`/ui`), their session cookie and static files
"""
