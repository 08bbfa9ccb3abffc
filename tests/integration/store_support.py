"""Helpers of the store, client and API tests: their own Redis database, so flushing it never touches the
catalogue or queues that session-wide workers keep in database 0."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

STORE_TEST_DB = 3


def store_db_url(redis_url: str, db: int = STORE_TEST_DB) -> str:
    """`redis_url` pointed at database `db`."""
    parts = urlsplit(redis_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))
