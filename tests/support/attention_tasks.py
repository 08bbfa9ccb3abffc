"""A team's attention task for the tests (the other side of TOOLLOOP_ATTENTION_TASK): a plain Celery app whose
one task records every notice it gets in Redis, where a team's would post it to a chat.

    celery -A tests.support.attention_tasks worker -Q toolloop.attention --pool=prefork
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery

ATTENTION_TASK = "teamapp.ask_approval"
# A list of the notices received, one JSON each, in order.
RECEIVED = "teamapp:attention:received"

app = Celery("teamapp", broker=os.environ.get("TOOLLOOP_REDIS_URL", "redis://localhost:6379/0"))
app.conf.update(accept_content=["json"], broker_connection_retry_on_startup=True)


@app.task(name=ATTENTION_TASK)
def ask_approval(waiting: dict[str, Any]) -> None:
    """Record the notice of a call waiting for a person."""
    client = redis.Redis.from_url(os.environ["TOOLLOOP_REDIS_URL"])
    try:
        client.rpush(RECEIVED, json.dumps(waiting))
    finally:
        client.close()
