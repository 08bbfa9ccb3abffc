"""Direct execution of one tool call, no model involved (SPEC §4.10): `toolloop call`, `Client.call_tool`.

Same path as a turn's calls: read the catalogue, validate (a rejection becomes an outcome, nothing is
dispatched), publish the task with a reply list, block on that list, read the outcome. The Redis client is
the one every reader uses (`store.connect_sync` / `connect_async`: same URL options, `rediss://` certificate
policy, default socket timeout), so the wait is a loop of BLPOPs of at most the store's `block_cap_ms`
each, until the caller's timeout — never one long block that would outlast the socket. When nothing arrives
in time, a synthetic `timeout` is written through the same first-writer-wins script, and whichever outcome
won is returned — so a late real result can never make a second one. When the synthetic one won, the task
is revoked with terminate: a tool nobody waits for any more stops now, not at its hard limit.

Redis errors (unreachable server) propagate as `redis.RedisError`; everything else is an outcome.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio as aioredis

from orchestrator.machine.validation import offered_tools, validate_call
from orchestrator.runtime.publish import dispatch_call, get_producer_app, revoke_call
from orchestrator.settings import Settings, get_settings
from orchestrator.store.catalogue import aread_catalogue, read_catalogue
from orchestrator.store.turns import block_cap_ms, build_block_ms, connect_async, connect_sync
from workers import keys
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, ToolSpec, build_failure

# Extra wait past the caller's timeout, for an outcome written right at it. It stays below the margin by which
# `build_limits` lets a capped soft limit pass the deadline, so the caller answers first, then revokes.
REPLY_GRACE_S = 0.25


def build_direct_request(
    name: str, arguments: Mapping[str, Any], context: Mapping[str, Any] | None, timeout_s: float, now: float
) -> ToolCallRequest:
    """The request of a direct call: its own call id, a deadline `timeout_s` away, a reply list."""
    call_id = f"direct-{uuid.uuid4().hex}"
    return ToolCallRequest(
        call_id=call_id,
        tool=name,
        arguments=dict(arguments),
        context=dict(context or {}),
        deadline_at=now + timeout_s,
        dispatched_at=now,
        reply_key=keys.reply(call_id),
    )


def build_rejection_outcome(
    name: str, arguments: Mapping[str, Any], catalogue: Mapping[str, ToolSpec]
) -> tuple[ToolOutcome | None, ToolSpec | None]:
    """(failure outcome, None) when the call is refused before dispatch, else (None, the tool's spec).

    A direct call names its tool, so a sensitive tool is callable here — but an unknown-tool message lists
    only the public ones.
    """
    offered = offered_tools(catalogue, None)
    if name in catalogue:
        offered[name] = catalogue[name]
    rejection = validate_call(name, arguments, None, catalogue, offered)
    if rejection is not None:
        call_id = f"direct-{uuid.uuid4().hex}"
        return build_failure((call_id, name, None), rejection.kind, rejection.message, attempts=0), None
    return None, catalogue[name]


def build_timeout_outcome(request: ToolCallRequest, timeout_s: float) -> ToolOutcome:
    """The synthetic outcome of a direct call that got no answer in time."""
    return build_failure(
        request,
        FailureKind.TIMEOUT,
        f"no outcome within {timeout_s:g} s",
        synthetic=True,
        attempts=0,
        finished_at=time.time(),
    )


def _settings_for(redis_url: str, settings: Settings | None) -> Settings:
    return (settings or get_settings()).model_copy(update={"redis_url": redis_url})


def build_wait_step_s(deadline: float, now: float, cap_ms: int) -> float | None:
    """The BLPOP timeout (s) of the next step of a wait until `deadline`; None once it has passed.

    Never 0 (BLPOP 0 waits forever) and never over `cap_ms`, so one step ends well within the socket timeout.
    """
    remaining_ms = (deadline - now) * 1000
    if remaining_ms <= 0:
        return None
    return build_block_ms(remaining_ms, cap_ms) / 1000


def _wait_reply(client: redis.Redis, reply_key: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    cap_ms = block_cap_ms(client)
    while (step_s := build_wait_step_s(deadline, time.monotonic(), cap_ms)) is not None:
        if client.blpop([reply_key], timeout=step_s) is not None:
            return


async def _await_reply(client: aioredis.Redis, reply_key: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    cap_ms = block_cap_ms(client)
    while (step_s := build_wait_step_s(deadline, time.monotonic(), cap_ms)) is not None:
        if await client.blpop([reply_key], timeout=step_s) is not None:
            return


def call_tool(
    redis_url: str,
    name: str,
    arguments: Mapping[str, Any],
    *,
    timeout_s: float,
    context: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
) -> ToolOutcome:
    """Run one tool call through the workers and return its outcome (blocking).

    `settings` (default: the environment's) give the broker and the `rediss://` certificate policy.
    """
    settings = _settings_for(redis_url, settings)
    client = connect_sync(redis_url, settings.redis_ssl_cert_reqs)
    try:
        rejected, spec = build_rejection_outcome(name, arguments, read_catalogue(client))
        if rejected is not None or spec is None:
            assert rejected is not None
            return rejected
        request = build_direct_request(name, arguments, context, timeout_s, time.time())
        app = get_producer_app(settings)
        task_id = dispatch_call(app, spec, request)
        _wait_reply(client, request.reply_key or "", timeout_s + REPLY_GRACE_S)
        raw = client.get(keys.outcome(request.call_id))
        if raw is None:
            script_keys, script_args = keys.build_write_outcome_call(
                request.call_id, None, build_timeout_outcome(request, timeout_s).model_dump_json()
            )
            if client.register_script(keys.WRITE_OUTCOME_LUA)(keys=script_keys, args=script_args):
                revoke_call(app, task_id, terminate=True)
            raw = client.get(keys.outcome(request.call_id))
        client.delete(request.reply_key or "")
        assert raw is not None
        return ToolOutcome.model_validate_json(raw)
    finally:
        client.close()


async def acall_tool(
    redis_url: str,
    name: str,
    arguments: Mapping[str, Any],
    *,
    timeout_s: float,
    context: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
) -> ToolOutcome:
    """`call_tool` for asyncio: the publish runs in a thread, the wait on the reply list is async."""
    settings = _settings_for(redis_url, settings)
    client = connect_async(redis_url, settings.redis_ssl_cert_reqs)
    try:
        rejected, spec = build_rejection_outcome(name, arguments, await aread_catalogue(client))
        if rejected is not None or spec is None:
            assert rejected is not None
            return rejected
        request = build_direct_request(name, arguments, context, timeout_s, time.time())
        app = get_producer_app(settings)
        task_id = await asyncio.to_thread(dispatch_call, app, spec, request)
        await _await_reply(client, request.reply_key or "", timeout_s + REPLY_GRACE_S)
        raw = await client.get(keys.outcome(request.call_id))
        if raw is None:
            script_keys, script_args = keys.build_write_outcome_call(
                request.call_id, None, build_timeout_outcome(request, timeout_s).model_dump_json()
            )
            if await client.register_script(keys.WRITE_OUTCOME_LUA)(keys=script_keys, args=script_args):
                await asyncio.to_thread(revoke_call, app, task_id, terminate=True)
            raw = await client.get(keys.outcome(request.call_id))
        await client.delete(request.reply_key or "")
        assert raw is not None
        return ToolOutcome.model_validate_json(raw)
    finally:
        await client.aclose()
