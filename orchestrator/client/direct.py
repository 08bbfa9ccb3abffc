"""Direct execution of one tool call, no model involved: `toolloop call`, `Client.call_tool`.

Same path as a turn's calls: read the catalogue (a tool a worker served within TOOLLOOP_TOOL_GONE_AFTER_S
counts: its call waits in its queue for the next worker, up to the caller's timeout), validate (a rejection
becomes an outcome, nothing is dispatched), refuse a `requires_confirmation` tool the caller did not approve
(`approve=True`, `toolloop call --approve`: the caller is the person who confirms; otherwise a
`confirmation_denied` outcome saying how to approve), publish the task with a reply list, block on that list,
read the outcome. The flow is written once (`build_call_flow`, sans-IO) and run by the store's runners:
`run_call` / `call_tool` on a sync client, `arun_call` on an asyncio one (where the publish runs in a thread).
The Redis client is the one every reader uses (`store.connect_sync` / `connect_async`: same URL options,
`rediss://` certificate policy, default socket timeout), so the wait is a loop of BLPOPs of at most the
client's `block_cap_ms` each, until the caller's timeout — never one long block that would outlast the socket.
When nothing arrives in time, a synthetic `timeout` is written through the same first-writer-wins script, and
whichever outcome won is returned — so a late real result can never make a second one. When the synthetic one
won, the task is revoked with terminate: a tool nobody waits for any more stops now, not at its hard limit.

Redis errors (unreachable server) propagate as `redis.RedisError`; everything else is an outcome.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from orchestrator.machine.validation import Rejection, offered_tools, validate_call
from orchestrator.settings import Settings, get_settings
from orchestrator.store import flows, operations
from orchestrator.store.catalogue import ToolCatalogue, get_tool_catalogue
from orchestrator.store.connection import block_cap_ms, connect_async, connect_sync
from orchestrator.store.effects import BlockingCall, Flow
from orchestrator.store.runner import AsyncRunner, SyncRunner
from orchestrator.store.scripts import WriteResult
from workers import keys
from workers.contract import (
    DEFAULT_TENANT,
    TENANT_PATTERN,
    FailureKind,
    ToolCallRequest,
    ToolOutcome,
    ToolSpec,
    build_failure,
)

DEFAULT_CALL_TIMEOUT_S = 60.0
# Extra wait past the caller's timeout, for an outcome written right at it. It stays below the margin by which
# `build_limits` lets a capped soft limit pass the deadline, so the caller answers first, then revokes.
REPLY_GRACE_S = 0.25


@dataclass(frozen=True)
class DirectCall:
    """What a caller asks for: one call of tool `name`, answered within `timeout_s`.

    `approve` says the caller confirms the call, as a person answering a turn's approval does: a
    `requires_confirmation` tool runs only with it."""

    name: str
    arguments: dict[str, Any]
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    context: dict[str, Any] = field(default_factory=dict)
    approve: bool = False
    # Whose call it is, as a turn's tenant: the tool's `ctx.tenant`.
    tenant: str = DEFAULT_TENANT


def build_direct_call(
    name: str,
    arguments: Mapping[str, Any],
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    context: Mapping[str, Any] | None = None,
    *,
    approve: bool = False,
    tenant: str | None = None,
) -> DirectCall:
    """A `DirectCall` from the arguments of `Client.call_tool` (whose signature this is); `tenant` None is
    "default"."""
    if tenant is not None and not re.fullmatch(TENANT_PATTERN, tenant):
        raise ValueError(f"'tenant' must match {TENANT_PATTERN}, not {tenant!r}")
    return DirectCall(
        name, dict(arguments), timeout_s, dict(context or {}), approve, tenant or DEFAULT_TENANT
    )


def build_direct_request(
    name: str,
    arguments: Mapping[str, Any],
    context: Mapping[str, Any] | None,
    timeout_s: float,
    now: float,
    *,
    tenant: str = DEFAULT_TENANT,
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
        tenant=tenant,
    )


def build_rejection_outcome(
    name: str, arguments: Mapping[str, Any], catalogue: Mapping[str, ToolSpec], *, approved: bool = False
) -> tuple[ToolOutcome | None, ToolSpec | None]:
    """(failure outcome, None) when the call is refused before dispatch, else (None, the tool's spec).

    A direct call names its tool, so a sensitive tool is callable here — but an unknown-tool message lists
    only the public ones. A valid call of a `requires_confirmation` tool is refused unless `approved`.
    """
    offered = offered_tools(catalogue, None)
    if name in catalogue:
        offered[name] = catalogue[name]
    rejection = validate_call(name, arguments, None, catalogue, offered)
    if rejection is None and catalogue[name].requires_confirmation and not approved:
        rejection = Rejection(
            FailureKind.CONFIRMATION_DENIED,
            f"tool '{name}' requires confirmation and was not approved; nothing was run. To run it, "
            "approve the call: `toolloop call --approve`, or `call_tool(..., approve=True)`",
        )
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


def build_call_flow(
    call: DirectCall,
    settings: Settings,
    *,
    cap_ms: int,
    now: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
) -> Flow[ToolOutcome]:
    """The whole direct call as a flow: validate, publish, wait on the reply list, read (or time out)."""
    # Celery loads with the first direct call, not with the Redis client module: a web app that never
    # calls a tool directly never imports it.
    from orchestrator.publishing.publisher import dispatch_call, get_producer_app, revoke_call

    # A tool between workers (served within TOOLLOOP_TOOL_GONE_AFTER_S) is called: it waits in its queue.
    tools: ToolCatalogue = yield get_tool_catalogue(now())
    catalogue = tools.known(now(), settings.tool_gone_after_s)
    rejected, spec = build_rejection_outcome(call.name, call.arguments, catalogue, approved=call.approve)
    if rejected is not None or spec is None:
        assert rejected is not None
        return rejected
    request = build_direct_request(
        call.name, call.arguments, call.context, call.timeout_s, now(), tenant=call.tenant
    )
    reply_key = request.reply_key or ""
    app = get_producer_app(settings)
    task_id = yield BlockingCall(partial(dispatch_call, app, spec, request))
    yield from flows.wait_reply(reply_key, call.timeout_s + REPLY_GRACE_S, cap_ms=cap_ms, clock=clock)
    outcome: ToolOutcome | None = yield operations.get_tool_outcome(request.call_id, None)
    if outcome is None:
        synthetic = build_timeout_outcome(request, call.timeout_s)
        written: tuple[WriteResult, str | None] = yield operations.write_outcome(synthetic)
        if written[0] is WriteResult.WON:  # a direct call has no turn: no owner to tell
            yield BlockingCall(partial(revoke_call, app, task_id, terminate=True))
        outcome = yield operations.get_tool_outcome(request.call_id, None)
    yield operations.delete(reply_key)
    assert outcome is not None
    return outcome


def _settings_for(redis_url: str, settings: Settings | None) -> Settings:
    return (settings or get_settings()).model_copy(update={"redis_url": redis_url})


def run_call(redis_url: str, call: DirectCall, settings: Settings | None = None) -> ToolOutcome:
    """Run one tool call through the workers and return its outcome (blocking).

    `settings` (default: the environment's) give the broker and the `rediss://` certificate policy.
    """
    settings = _settings_for(redis_url, settings)
    client = connect_sync(redis_url, settings.redis_ssl_cert_reqs)
    try:
        return SyncRunner(client).run_flow(build_call_flow(call, settings, cap_ms=block_cap_ms(client)))
    finally:
        client.close()


async def arun_call(redis_url: str, call: DirectCall, settings: Settings | None = None) -> ToolOutcome:
    """`run_call` for asyncio: the publish runs in a thread, the wait on the reply list is async."""
    settings = _settings_for(redis_url, settings)
    client = connect_async(redis_url, settings.redis_ssl_cert_reqs)
    try:
        flow = build_call_flow(call, settings, cap_ms=block_cap_ms(client))
        return await AsyncRunner(client).run_flow(flow)
    finally:
        await client.aclose()


def call_tool(
    redis_url: str,
    name: str,
    arguments: Mapping[str, Any],
    *,
    timeout_s: float,
    context: Mapping[str, Any] | None = None,
    approve: bool = False,
    settings: Settings | None = None,
) -> ToolOutcome:
    """`run_call` of tool `name` with `arguments`, answered within `timeout_s` (`toolloop call`)."""
    call = build_direct_call(name, arguments, timeout_s, context, approve=approve)
    return run_call(redis_url, call, settings)
