"""Tools the demo conversation uses: deterministic weather, and a small ticket desk kept in Redis.

The ticket desk shows the guardrails a real app needs: `create_ticket` is idempotent (the same request
twice files one ticket), `close_ticket` asks a person to confirm first, and `delete_ticket` is sensitive by
its name, so a turn gets it only when it names it.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Annotated, Any, Literal

import redis
from pydantic import Field

from workers import ToolContext, tool
from workers.connect import connect_redis
from workers.settings import get_worker_settings

# The example app's own data (not toolloop's): a hash of ticket id -> ticket JSON.
TICKETS_KEY = "toolloop-demo:tickets"

_KNOWN_WEATHER: dict[str, tuple[float, str]] = {
    "paris": (18.0, "partly cloudy"),
    "london": (14.0, "light rain"),
    "tokyo": (22.0, "clear"),
    "new york": (20.0, "sunny"),
    "berlin": (16.0, "overcast"),
}
_CONDITIONS = ("clear", "sunny", "partly cloudy", "overcast", "light rain", "windy")


@tool(soft_time_limit=5, time_limit=10)
def get_weather(
    city: Annotated[str, Field(min_length=1, max_length=100)],
    unit: Literal["celsius", "fahrenheit"] = "celsius",
) -> dict[str, Any]:
    """Get the current weather for a city: temperature and conditions.

    Args:
        city: the city name, e.g. "Paris"
        unit: temperature unit
    """
    key = city.strip().lower()
    if key in _KNOWN_WEATHER:
        celsius, conditions = _KNOWN_WEATHER[key]
    else:
        # Deterministic for any other city, so the demo and its tests are repeatable.
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        celsius, conditions = float(digest[0] % 35 - 5), _CONDITIONS[digest[1] % len(_CONDITIONS)]
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return {"city": city.strip(), "temperature": temperature, "unit": unit, "conditions": conditions}


def _tickets() -> redis.Redis:
    settings = get_worker_settings()
    return connect_redis(settings.redis_url, settings.redis_ssl_cert_reqs)


@tool(idempotency="args", soft_time_limit=5, time_limit=10)
def create_ticket(
    title: Annotated[str, Field(min_length=1, max_length=200)],
    body: Annotated[str, Field(max_length=5000)] = "",
    ctx: ToolContext | None = None,
) -> dict[str, Any]:
    """File a support ticket and return its id. Filing the same ticket twice files it once.

    Args:
        title: a one-line summary
        body: the details
    """
    ticket = {
        "id": uuid.uuid4().hex[:12],
        "title": title,
        "body": body,
        "status": "open",
        "created_at": time.time(),
        "user": (ctx.context.get("user_id") if ctx else None),
    }
    _tickets().hset(TICKETS_KEY, ticket["id"], json.dumps(ticket))
    return ticket


@tool(requires_confirmation=True, soft_time_limit=5, time_limit=10)
def close_ticket(ticket_id: Annotated[str, Field(min_length=1, max_length=64)]) -> dict[str, Any]:
    """Close an open support ticket (a person confirms first).

    Args:
        ticket_id: the id returned by create_ticket
    """
    client = _tickets()
    raw = client.hget(TICKETS_KEY, ticket_id)
    if raw is None:
        raise LookupError(f"no ticket {ticket_id}")
    ticket: dict[str, Any] = json.loads(raw)
    ticket["status"] = "closed"
    client.hset(TICKETS_KEY, ticket_id, json.dumps(ticket))
    return ticket


@tool(requires_confirmation=True, soft_time_limit=5, time_limit=10)
def delete_ticket(ticket_id: Annotated[str, Field(min_length=1, max_length=64)]) -> str:
    """Delete a ticket for good (sensitive: offered only when a turn names it).

    Args:
        ticket_id: the id returned by create_ticket
    """
    if not _tickets().hdel(TICKETS_KEY, ticket_id):
        raise LookupError(f"no ticket {ticket_id}")
    return f"ticket {ticket_id} deleted"
