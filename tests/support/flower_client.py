"""Reading a real Flower over HTTP for the Flower tests: sending a call, waiting for its state, and looking
for secrets in everything Flower answers.

Flower learns tasks only from worker events, so a test first waits until Flower receives this worker's
heartbeats (`wait_for_flower_events`), then sends its call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support.calls import wait_tool_outcome
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for, wait_until
from workers import keys
from workers.contract import ToolCallRequest, ToolOutcome

AUTH = ("ops", "flower-pass")


def flower_get(base: str, path: str, **params: Any) -> httpx.Response:
    """GET a Flower page or API path with basic auth."""
    return httpx.get(f"{base}{path}", params=params, auth=AUTH, timeout=10)


def flower_post(base: str, path: str, **params: Any) -> httpx.Response:
    """POST to a Flower API path with basic auth (its control API: revoke, consumers)."""
    return httpx.post(f"{base}{path}", params=params, auth=AUTH, timeout=10)


def wait_for_flower_events(base: str, hostname: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Until Flower has received an event (a heartbeat, every 2 s) of `hostname`: it sees its tasks then."""
    wait_until(
        lambda: flower_get(base, "/api/workers", status="true").json().get(hostname),
        f"flower to receive an event of worker {hostname}",
        timeout_s,
    )


@dataclass(frozen=True)
class SentCall:
    """A tool call published as the orchestrator publishes it, and the secrets it carries."""

    task_id: str
    call_id: str
    turn_id: str
    secrets: tuple[str, ...] = field(default=())


def send_call(redis_url: str, tool: str, **arguments: Any) -> SentCall:
    """Publish one call of `tool` with a secret `api_token` (when the tool takes one) and a secret context.

    The context value is a plain key's (`user_email`): the whole context is the web app's and must never
    show, whatever its keys.
    """
    tag = uuid.uuid4().hex[:12]
    client = redis.Redis.from_url(redis_url)
    try:
        spec = read_catalogue(client)[tool]
        # A worker refuses a call whose turn does not exist (Redis lost it): this call's turn is a record.
        client.set(keys.turn_request(f"turn_{tag}"), "{}", ex=3600)
    finally:
        client.close()
    token, email = f"tok-SECRET-{tag}", f"alice-{tag}@example.com"
    if "api_token" in spec.parameters.get("properties", {}):
        arguments = {**arguments, "api_token": token}
    request = ToolCallRequest(
        call_id=f"call_{tag}",
        tool=tool,
        arguments=arguments,
        turn_id=f"turn_{tag}",
        context={"user_email": email},
    )
    task_id = dispatch_call(get_producer_app(Settings(redis_url=redis_url)), spec, request)
    return SentCall(task_id, request.call_id, f"turn_{tag}", (token, email))


def wait_for_outcome(redis_url: str, call_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ToolOutcome:
    """The call's outcome in Redis (the record), once written."""
    client = redis.Redis.from_url(redis_url)
    try:
        return wait_tool_outcome(client, call_id, timeout_s)
    finally:
        client.close()


def wait_for_state(
    base: str, task_id: str, state: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """Flower's record of the task (`/api/task/info/<id>`) once its state is `state`."""
    last_seen: dict[str, Any] = {}

    def shown() -> dict[str, Any] | None:
        nonlocal last_seen
        response = flower_get(base, f"/api/task/info/{task_id}")
        if response.status_code != 200:
            return None
        last_seen = response.json()
        return last_seen if last_seen.get("state") == state and last_seen.get("name") else None

    return wait_for(
        shown,
        f"flower to show task {task_id} as {state}",
        timeout_s,
        detail=lambda: f"last seen: {last_seen}",
    )


def read_everything_shown(base: str, task_id: str) -> dict[str, str]:
    """Every Flower answer that can show the task, by what it is: the API's task list and task info, the
    task's result as Flower reads it, the task page, and the table behind the tasks page."""
    table_query = {
        "draw": "1",
        "start": "0",
        "length": "100",
        "search[value]": "",
        "order[0][column]": "0",
        "order[0][dir]": "desc",
        "columns[0][data]": "received",
    }
    answers = {
        "api/tasks": flower_get(base, "/api/tasks"),
        "api/task/info": flower_get(base, f"/api/task/info/{task_id}"),
        "api/task/result": flower_get(base, f"/api/task/result/{task_id}"),
        "task page": flower_get(base, f"/task/{task_id}"),
        "tasks table": flower_get(base, "/tasks/datatable", **table_query),
    }
    # Flower answers 503 for a task's result when its app has no result backend: nothing shown, then.
    if answers["api/task/result"].status_code == 503:
        del answers["api/task/result"]
    for name, response in answers.items():
        assert response.status_code == 200, (name, response.status_code, response.text[:500])
    return {name: response.text for name, response in answers.items()}


def assert_flower_hides(base: str, sent: SentCall) -> None:
    """No secret of the call in any Flower answer, while the task itself is there (so the check means
    something); JSON answers are also read decoded, so an escaped secret cannot slip through."""
    shown = read_everything_shown(base, sent.task_id)
    assert sent.task_id in shown["api/tasks"] and sent.call_id in shown["tasks table"]
    for name, text in shown.items():
        decoded = text
        if name.startswith("api") or name == "tasks table":
            decoded = json.dumps(json.loads(text), ensure_ascii=False)
        for secret in sent.secrets:
            assert secret not in text and secret not in decoded, f"{secret!r} shown by flower's {name}"
