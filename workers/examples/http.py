"""`http_fetch`: an HTTP GET through httpx with its own limits (timeout, bytes read)."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from pydantic import Field

from workers import TransientToolError, tool

MAX_BYTES_CAP = 1_000_000


@tool(soft_time_limit=20, time_limit=30, retries=2, max_result_bytes=64 * 1024)
def http_fetch(
    url: Annotated[str, Field(pattern=r"^https?://", max_length=2048)],
    timeout_s: Annotated[float, Field(gt=0, le=15)] = 10.0,
    max_bytes: Annotated[int, Field(gt=0, le=MAX_BYTES_CAP)] = 65_536,
) -> dict[str, Any]:
    """Fetch a web page or API response with an HTTP GET and return its status, type and text.

    Reads at most max_bytes of the body; a connection failure or a 5xx answer is retried.

    Args:
        url: the http:// or https:// URL to fetch
        timeout_s: seconds allowed for connecting and for each read
        max_bytes: the most bytes of the body to read
    """
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=True, max_redirects=5) as client,
            client.stream("GET", url) as response,
        ):
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) >= max_bytes:
                    break
            status = response.status_code
            content_type = response.headers.get("content-type", "")
            final_url = str(response.url)
            encoding = response.encoding or "utf-8"
    except (httpx.ConnectError, httpx.TimeoutException) as exc:
        raise TransientToolError(f"could not fetch {url}: {exc}") from exc
    if status >= 500:
        raise TransientToolError(f"{url} answered HTTP {status}")
    truncated = len(body) > max_bytes
    return {
        "url": final_url,
        "status": status,
        "content_type": content_type,
        "text": bytes(body[:max_bytes]).decode(encoding, errors="replace"),
        "bytes_read": min(len(body), max_bytes),
        "truncated": truncated or len(body) == max_bytes,
    }
