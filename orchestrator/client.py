"""What web apps import: submit a turn, read it, wait for it, follow its events, cancel it, answer approvals.

`Client` is synchronous, on the sync `redis` client, so a Django or Flask view can call it without an event
loop; `AsyncClient` has the same methods as coroutines, on the async `TurnStore`. Both go through the pure
helpers of `orchestrator.store.codec`, so the storage layout and its scripts are written once.

Errors: bad input raises `ValueError` (pydantic's `ValidationError` is one) with a clear message; an unknown
turn id raises `UnknownTurnError` (a `LookupError`); `wait` raises `TimeoutError`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from orchestrator import metrics
from orchestrator.errors import UnknownTurnError
from orchestrator.model import Limits, Message, TurnOutcome, TurnRequest
from orchestrator.settings import Settings, get_settings
from orchestrator.store import codec, turn_view
from orchestrator.store.codec import TurnEvent
from orchestrator.store.turn_view import PendingApproval, TurnView
from orchestrator.store.turns import TurnStore, block_cap_ms, build_block_ms, connect_sync
from workers import keys
from workers.contract import ToolOutcome

__all__ = ["AsyncClient", "Client", "PendingApproval", "TurnEvent", "TurnView", "UnknownTurnError"]

DEFAULT_CALL_TIMEOUT_S = 60.0


def _build_request(
    *,
    prompt: str | None,
    messages: Sequence[Message | Mapping[str, Any]] | None,
    tools: Sequence[str] | None,
    model: str | None,
    limits: Limits | Mapping[str, Any] | None,
    context: Mapping[str, Any] | None,
    conversation_id: str | None,
    tool_choice: str | None,
) -> TurnRequest:
    if isinstance(tools, str):
        raise ValueError("'tools' is a list of tool names, not a string")
    return codec.build_turn_request(
        prompt=prompt,
        messages=messages,
        tools=tools,
        model=model,
        limits=limits,
        context=context,
        conversation_id=conversation_id,
        tool_choice=tool_choice,
    )


class Client:
    """Synchronous client: `Client(redis_url=None)` uses `TOOLLOOP_REDIS_URL` (settings) by default."""

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.redis_url = redis_url or self.settings.redis_url
        self.redis = connect_sync(self.redis_url, self.settings.redis_ssl_cert_reqs)
        self._submit = self.redis.register_script(codec.SUBMIT_LUA)
        self._control = self.redis.register_script(codec.CONTROL_LUA)
        # Reads block in steps well under the socket timeout, however long the caller waits (store.py).
        self.block_cap_ms = block_cap_ms(self.redis)

    # Positional like the documented `submit(prompt=None, messages=None, …)` (ARCHITECTURE.md).
    def submit(  # noqa: PLR0917
        self,
        prompt: str | None = None,
        messages: Sequence[Message | Mapping[str, Any]] | None = None,
        tools: Sequence[str] | None = None,
        model: str | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None,
        conversation_id: str | None = None,
        tool_choice: str | None = None,
        *,
        turn_id: str | None = None,
    ) -> str:
        """Store and queue a turn; returns its id once it is in Redis. A repeated `turn_id` is a no-op."""
        request = _build_request(
            prompt=prompt,
            messages=messages,
            tools=tools,
            model=model,
            limits=limits,
            context=context,
            conversation_id=conversation_id,
            tool_choice=tool_choice,
        )
        return self.submit_request(request, turn_id=turn_id)

    def submit_request(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Store and queue an already built `TurnRequest`."""
        codec.check_turn_request(request)
        tid = codec.validate_turn_id(turn_id) if turn_id else codec.new_turn_id()
        keys_, args = codec.build_submit_call(request, tid, codec.now_s())
        self._submit(keys=keys_, args=args)
        metrics.record_turn_submitted()
        return tid

    def get(self, turn_id: str) -> TurnView:
        """Status, request, transcript so far, calls waiting for approval, and the outcome once terminal."""
        view = turn_view.build_turn_view(turn_id, *self.redis.mget(turn_view.view_keys(turn_id)))
        if view is None:
            raise UnknownTurnError(turn_id)
        return view

    def outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome, or None while the turn runs."""
        return codec.parse_outcome(self.redis.get(keys.turn_outcome(turn_id)))

    def wait(self, turn_id: str, timeout: float) -> TurnOutcome:
        """Block until the turn is terminal (woken by its events stream); `TimeoutError` after `timeout` s.

        A turn may stay silent for longer than the Redis socket timeout (a long tool, a wait for approval):
        each read blocks at most `block_cap_ms` and the wait goes on until `timeout`."""
        deadline = time.monotonic() + timeout
        newest = self.redis.xrevrange(keys.turn_events(turn_id), count=1)
        after = codec.text(newest[0][0]) if newest else "0"
        while True:
            outcome = self.outcome(turn_id)
            if outcome is not None:
                return outcome
            if self.redis.get(keys.turn_status(turn_id)) is None:
                raise UnknownTurnError(turn_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"turn {turn_id} did not finish within {timeout:g} s")
            batch = self._read_events(turn_id, after, remaining * 1000)
            if batch:
                after = batch[-1].id

    def events(self, turn_id: str, after: str = "0", *, block_ms: int | None = None) -> Iterator[TurnEvent]:
        """The turn's events as they come, from `after` on, ending after `turn_finished`.

        Each read blocks at most `block_ms` (default and cap: `block_cap_ms`); quiet spells are waited out."""
        if self.redis.get(keys.turn_status(turn_id)) is None:
            raise UnknownTurnError(turn_id)
        while True:
            # Checked before the read, as in `TurnStore.iter_events`: an ended turn's events are all stored.
            ended = self._ended(turn_id)
            batch = self._read_events(turn_id, after, None if ended else (block_ms or self.block_cap_ms))
            for event in batch:
                yield event
                if event.name == codec.TURN_FINISHED:
                    return
            if batch:
                after = batch[-1].id
            elif ended:
                return

    def cancel(self, turn_id: str) -> bool:
        """Ask for the turn to be cancelled; False when it had already ended."""
        return self._send_control(turn_id, "cancel", None, None)

    def approve(self, turn_id: str, call_id: str, approved: bool) -> bool:
        """Approve (True) or deny (False) a call waiting for confirmation; False when the turn had ended."""
        if not call_id:
            raise ValueError("call_id must not be empty")
        return self._send_control(turn_id, "approval", call_id, approved)

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        context: Mapping[str, Any] | None = None,
    ) -> ToolOutcome:
        """Run one tool call through the workers, no model involved (SPEC §4.10); returns its outcome."""
        from orchestrator.direct import call_tool

        return call_tool(
            self.redis_url,
            name,
            dict(arguments),
            timeout_s=timeout_s,
            context=dict(context or {}),
            settings=self.settings,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _read_events(self, turn_id: str, after: str, block_ms: float | None) -> list[TurnEvent]:
        block = None if block_ms is None else build_block_ms(block_ms, self.block_cap_ms)
        reply = self.redis.xread({keys.turn_events(turn_id): after}, block=block)
        return [codec.parse_event(turn_id, i, f) for i, f in codec.parse_stream_reply(reply)]

    def _ended(self, turn_id: str) -> bool:
        status = codec.parse_status(self.redis.get(keys.turn_status(turn_id)))
        return status is None or status.terminal

    def _send_control(self, turn_id: str, kind: str, call_id: str | None, approved: bool | None) -> bool:
        keys_, args = codec.build_control_call(turn_id, kind, call_id, approved, codec.now_s())
        result = int(self._control(keys=keys_, args=args))
        if result < 0:
            raise UnknownTurnError(turn_id)
        return result == 1


class AsyncClient:
    """Asynchronous client with the same methods as `Client`, for asyncio web apps (FastAPI, Starlette)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        store: TurnStore | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.redis_url = redis_url or self.settings.redis_url
        self.store = store or TurnStore.from_url(
            self.redis_url, ssl_cert_reqs=self.settings.redis_ssl_cert_reqs
        )

    # Positional like the documented `submit(prompt=None, messages=None, …)` (ARCHITECTURE.md).
    async def submit(  # noqa: PLR0917
        self,
        prompt: str | None = None,
        messages: Sequence[Message | Mapping[str, Any]] | None = None,
        tools: Sequence[str] | None = None,
        model: str | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None,
        conversation_id: str | None = None,
        tool_choice: str | None = None,
        *,
        turn_id: str | None = None,
    ) -> str:
        """Store and queue a turn; returns its id once it is in Redis."""
        request = _build_request(
            prompt=prompt,
            messages=messages,
            tools=tools,
            model=model,
            limits=limits,
            context=context,
            conversation_id=conversation_id,
            tool_choice=tool_choice,
        )
        return await self.submit_request(request, turn_id=turn_id)

    async def submit_request(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Store and queue an already built `TurnRequest`."""
        tid = await self.store.submit(request, turn_id=turn_id)
        metrics.record_turn_submitted()
        return tid

    async def get(self, turn_id: str) -> TurnView:
        """Status, request, transcript so far, calls waiting for approval, and the outcome once terminal."""
        view = await self.store.get_view(turn_id)
        if view is None:
            raise UnknownTurnError(turn_id)
        return view

    # `timeout` rather than asyncio.timeout: the same signature as the sync `Client.wait` (the contract).
    async def wait(self, turn_id: str, timeout: float) -> TurnOutcome:  # noqa: ASYNC109
        """Block until the turn is terminal; `TimeoutError` after `timeout` s."""
        return await self.store.wait_outcome(turn_id, timeout)

    async def events(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[TurnEvent]:
        """The turn's events as they come, from `after` on, ending after `turn_finished`."""
        async for event in self.store.iter_events(turn_id, after, block_ms=block_ms):
            yield event

    async def cancel(self, turn_id: str) -> bool:
        """Ask for the turn to be cancelled; False when it had already ended."""
        return await self.store.request_cancel(turn_id)

    async def approve(self, turn_id: str, call_id: str, approved: bool) -> bool:
        """Approve or deny a call waiting for confirmation; False when the turn had ended."""
        return await self.store.request_approval(turn_id, call_id, approved)

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any],
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        context: Mapping[str, Any] | None = None,
    ) -> ToolOutcome:
        """Run one tool call through the workers, no model involved (SPEC §4.10); returns its outcome."""
        from orchestrator.direct import acall_tool

        return await acall_tool(
            self.redis_url,
            name,
            dict(arguments),
            timeout_s=timeout_s,
            context=dict(context or {}),
            settings=self.settings,
        )

    async def ping(self) -> bool:
        """True when Redis answers."""
        return await self.store.ping()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.store.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
