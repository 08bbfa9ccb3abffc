"""The Redis side of executing a call: `CallStore`, over the scripts of `workers.scripts`.

One start script per execution (`start.lua`) does the redelivery dedupe, the fence (`workers.fence`), the
running guard, the attempt count and the "started" notification in a single round trip; one pipeline writes
the outcome and its companions (`OutcomeWrite`, which the spool keeps when Redis refuses it), the outcome's
script dropping the running guard itself. Every step takes an optional `RedisRetry` (workers.redis_retry) and
is safe to repeat after a lost reply: the start script knows its execution's token, the idempotency claim its
holder, and a repeated outcome write first looks whether the earlier try's outcome landed.

A call's keys are named with its turn (`keys.outcome(call_id, turn_id)`: on a Redis Cluster they share the
turn's slot), so every method that names a call takes its turn id too (None: a direct call). On a cluster the
owner's inbox is in another slot than the scripts' keys: the start and the outcome write each add their
notification in a command of their own, right after the script that named the owner (`workers.scripts`). A
try repeated after a failure notifies again (the owner drops a duplicate), so a notification is lost only
with the try that wrote it for good.

Design notes: docs/design/tool-calls.md, "Redelivery and the fence".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict

from workers import keys, packing, scripts
from workers.connect import DEFAULT_SSL_CERT_REQS, connect_redis
from workers.contract import ToolCallRequest, ToolOutcome, dump_tool_outcome, parse_tool_outcome
from workers.fence import parse_fence
from workers.progress import ProgressSink
from workers.redis_errors import RedisErrorKind, classify
from workers.redis_retry import RedisRetry
from workers.settings import get_worker_settings


def build_attempts_ttl_s() -> int:
    """How long a call's attempt count and fence are kept: as long as its outcome or its audit records
    (`TOOLLOOP_OUTCOME_TTL_S`, `TOOLLOOP_AUDIT_TTL_S`), whichever is longer."""
    settings = get_worker_settings()
    return max(settings.outcome_ttl_s, settings.audit_ttl_s)


class OutcomeWrite(BaseModel):
    """One outcome and everything written or dropped with it: what `CallStore.finish` performs in one round
    trip, and what the spool keeps (as JSON) while Redis refuses it.

    `holder` names the execution whose running guard and idempotency lock (`idempotency_lock`, a key) go
    with the write — a token, or with `holder_is_prefix` the prefix the worker's parent names its pool
    process by (`workers.fence`). `fence_attempt`/`fence_holder` fence the write (None: no fence).
    """

    model_config = ConfigDict(frozen=True)

    call_id: str
    turn_id: str | None = None
    outcome_json: str
    reply_key: str | None = None
    fence_attempt: int | None = None
    fence_holder: str = ""
    holder: str | None = None
    holder_is_prefix: bool = False
    idempotency_lock: str | None = None
    full_result_key: str | None = None
    full_result_json: str | None = None
    idempotency_key: str | None = None
    idempotency_record: str | None = None

    @classmethod
    def of(cls, outcome: ToolOutcome, fence: scripts.Fence | None, **fields: Any) -> OutcomeWrite:
        """The write of `outcome`, fenced by `fence`, with the companions in `fields`."""
        return cls(
            call_id=outcome.call_id,
            turn_id=outcome.turn_id,
            outcome_json=dump_tool_outcome(outcome),
            fence_attempt=fence.attempt if fence is not None else None,
            fence_holder=fence.holder if fence is not None else "",
            **fields,
        )

    @property
    def fence(self) -> scripts.Fence | None:
        """The fence of this write, if any."""
        return (
            scripts.Fence(self.fence_attempt, self.fence_holder) if self.fence_attempt is not None else None
        )


class CallStore:
    """The Redis side of executing calls: one per process, its scripts registered once."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = client.register_script(scripts.START.source)
        self._release = client.register_script(scripts.RELEASE.source)
        self._claim = client.register_script(scripts.CLAIM_IDEMPOTENCY.source)
        self._write = client.register_script(scripts.WRITE_OUTCOME.source)
        # Where the tools' `ctx.progress` reports go (`get_store` sets it); None: progress is a no-op.
        self.progress: ProgressSink | None = None

    def start(
        self,
        request: ToolCallRequest,
        *,
        token: str,
        running_ttl_s: float,
        worker: str,
        retry: RedisRetry | None = None,
    ) -> tuple[int, int]:
        """Run the start script: (attempt, 0) when started; else (StartResult.FINISHED, 0), (HELD, pttl ms),
        (SUPERSEDED, current dispatch attempt) or (TURN_GONE, 0).

        With `retry`, tried again while Redis is unavailable (the script is safe to repeat per token).
        """
        call_id, turn = request.call_id, request.turn_id
        outcome_key = keys.outcome(call_id, turn)
        absent = scripts.build_absent_key(outcome_key)

        def once(_failures: int) -> Any:
            at = f"{time.time():.3f}"
            reply = self._start(
                keys=[
                    outcome_key,
                    keys.running(call_id, turn),
                    keys.attempts(call_id, turn),
                    keys.turn_lease(turn) if turn else absent,
                    keys.fence(call_id, turn),
                    keys.turn_request(turn) if turn else absent,
                ],
                args=[
                    token,
                    int(running_ttl_s * 1000),
                    build_attempts_ttl_s(),
                    scripts.build_inbox_prefix(),
                    call_id,
                    turn or "",
                    worker,
                    at,
                    keys.INBOX_MAXLEN,
                    request.attempt,
                ],
            )
            owner = scripts.parse_start_owner(reply)
            if owner is not None and turn is not None:
                fields = scripts.build_started_notification(
                    turn, call_id, attempt=int(reply[1]), worker=worker, at=at
                )
                self._notify(owner, fields)
            return reply

        reply = retry.call(once, "the start of a call") if retry is not None else once(0)
        return scripts.parse_start_reply(reply)

    def is_current(
        self, call_id: str, turn_id: str | None, token: str, retry: RedisRetry | None = None
    ) -> bool:
        """True while the execution holding `token` is the call's current one (the fence; no fence at all —
        Redis lost it — counts as current, as `write_outcome.lua` has it)."""

        def once(_failures: int) -> Any:
            return self.client.get(keys.fence(call_id, turn_id))

        current = retry.call(once, "the fence of a call") if retry is not None else once(0)
        return current is None or parse_fence(_text(current))[0] == token

    def finish(
        self, write: OutcomeWrite, *, retry: RedisRetry | None = None, check_landed: bool = False
    ) -> scripts.WriteResult:
        """Write the outcome (first writer wins, fenced), the full result and idempotency record; drop the
        holder's guard and idempotency lock. One pipeline, one round trip.

        The stored success is set before the lock goes, so a waiting identical call always finds one or the
        other — even when the write itself is FENCED: a superseded execution's success still replays. With
        `retry`, written again while Redis is unavailable; a try after a failed one (every try with
        `check_landed`) first looks whether an earlier one's outcome landed (its reply was lost), so it is
        neither written twice nor filed as a late duplicate.
        """

        def once(failures: int) -> scripts.WriteResult:
            try:
                return self._finish_once(write, check_landed=failures > 0 or check_landed)
            except redis.RedisError as exc:
                meaning = classify(exc)
                if meaning is None or meaning.kind is not RedisErrorKind.NO_SCRIPT:
                    raise
                # Redis lost its scripts (a restart, SCRIPT FLUSH): load them, then try again, looking first
                # whether the write landed before the error.
                for script in (self._write, self._release):
                    self.client.script_load(script.script)
                return self._finish_once(write, check_landed=True)

        return retry.call(once, f"the outcome of {write.call_id}") if retry is not None else once(0)

    def _finish_once(self, write: OutcomeWrite, *, check_landed: bool) -> scripts.WriteResult:
        call_id, turn_id = write.call_id, write.turn_id
        stored = self.client.get(keys.outcome(call_id, turn_id)) if check_landed else None
        landed = stored is not None and packing.unpack(stored) == write.outcome_json
        packed = packing.pack(write.outcome_json)  # once, for the script and a cluster's notification both
        # On a cluster the owner is notified here, not by the script. A write that landed already (an
        # earlier try's reply lost) may have left it unnotified: its owner is read with the rest, told again.
        lease_key = keys.turn_lease(turn_id) if keys.is_cluster_layout() and turn_id is not None else None
        pipe = self.client.pipeline(transaction=False)
        if write.full_result_json is not None and write.full_result_key:
            pipe.set(write.full_result_key, write.full_result_json, ex=keys.FULL_RESULT_TTL_S)
        if write.idempotency_key is not None and write.idempotency_record is not None:
            pipe.set(write.idempotency_key, write.idempotency_record, ex=keys.IDEMPOTENCY_TTL_S)
        won_index = len(pipe)
        if not landed:
            # The script drops the holder's running guard itself, whatever the write's result.
            script_keys, script_args = scripts.build_write_outcome_call(
                call_id,
                turn_id,
                packed,
                write.reply_key,
                write.fence,
                running_holder=write.holder,
                running_holder_is_prefix=write.holder_is_prefix,
            )
            _queue_script(pipe, self._write.sha, script_keys, script_args)
        elif lease_key is not None:
            pipe.get(lease_key)
        if write.holder is not None:
            holder = [write.holder, "1" if write.holder_is_prefix else ""]
            if landed:
                running = keys.running(call_id, turn_id)
                _queue_script(pipe, self._release.sha, [running], holder)
            if write.idempotency_lock is not None:
                _queue_script(pipe, self._release.sha, [write.idempotency_lock], holder)
        results = pipe.execute()
        if landed:
            owner = scripts.parse_owner(results[won_index]) if lease_key is not None else None
            result = scripts.WriteResult.WON
        else:
            result, owner = scripts.parse_write_reply(results[won_index])
        if result is scripts.WriteResult.WON and owner is not None and turn_id is not None:
            fields = scripts.build_outcome_notification(turn_id, call_id, packed)
            self._notify(owner, fields)
        return result

    def _notify(self, owner: str, fields: Mapping[str, str | bytes]) -> None:
        # The notification a script adds on one Redis, added by its caller on a Redis Cluster.
        client: Any = self.client  # redis-py's execute_command is untyped
        client.execute_command(*scripts.build_notify_command(owner, fields))

    def claim_idempotency(
        self, key: str, *, holder: str, lock_ttl_s: float, retry: RedisRetry | None = None
    ) -> tuple[scripts.IdempotencyClaim, str | None]:
        """(STORED, stored success JSON); (CLAIMED, None): the execution `holder` holds the key's lock; (BUSY,
        None): another does.

        With `retry`, tried again while Redis is unavailable (the claim is safe to repeat per holder)."""

        def once(_failures: int) -> Any:
            return self._claim(keys=[key, keys.idempotency_lock(key)], args=[holder, int(lock_ttl_s * 1000)])

        reply = retry.call(once, "an idempotency claim") if retry is not None else once(0)
        return scripts.parse_idempotency_claim(reply)

    def release_idempotency_lock(self, key: str, holder: str, *, prefix: bool = False) -> None:
        """Drop the lock on an idempotency key if `holder` holds it (`prefix`: a token starting with it)."""
        self._release(keys=[keys.idempotency_lock(key)], args=[holder, "1" if prefix else ""])

    def release(self, call_id: str, turn_id: str | None, holder: str, *, prefix: bool = False) -> None:
        """Drop the running guard if `holder` holds it (`prefix`: a token starting with it; '': anyone)."""
        self._release(keys=[keys.running(call_id, turn_id)], args=[holder, "1" if prefix else ""])

    def read_holder(self, call_id: str, turn_id: str | None) -> str | None:
        """The token of the execution holding the call's running guard, if any."""
        value = self.client.get(keys.running(call_id, turn_id))
        return _text(value) if value is not None else None

    def read_worker_pttl_ms(self, worker: str) -> int:
        """What is left of `worker`'s heartbeat key's life, in ms (-2: no heartbeat; `keys.worker_seen`)."""
        return int(self.client.pttl(keys.worker_seen(worker)))

    def read_attempts(self, call_id: str, turn_id: str | None) -> int:
        """How many executions of the call have started: the count its fence holds (`workers.fence`), or
        for a fence an older worker wrote, the attempts key it kept."""
        fence = self.client.get(keys.fence(call_id, turn_id))
        count = parse_fence(_text(fence))[1] if fence is not None else None
        if count is not None:
            return count
        value = self.client.get(keys.attempts(call_id, turn_id))
        return int(value) if value is not None else 0

    def read_outcome(self, call_id: str, turn_id: str | None) -> ToolOutcome | None:
        """The call's winning outcome, if any."""
        raw = self.client.get(keys.outcome(call_id, turn_id))
        return parse_tool_outcome(raw) if raw is not None else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _queue_script(pipe: Any, sha: str, script_keys: list[str], args: Sequence[str | bytes]) -> None:
    # EVALSHA straight into the pipeline: a registered Script in a pipeline first asks SCRIPT EXISTS, one more
    # round trip per call; a missing script comes back as NoScriptError instead. Through execute_command: a
    # cluster client's pipeline refuses its `evalsha` method (not the command, which it routes by its keys).
    pipe.execute_command("EVALSHA", sha, len(script_keys), *script_keys, *args)


_stores: dict[str, CallStore] = {}
_stores_lock = threading.Lock()


def get_store(redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS) -> CallStore:
    """The process's CallStore for `redis_url` (redis-py pools reconnect by themselves after a fork)."""
    with _stores_lock:
        store = _stores.get(redis_url)
        if store is None:
            store = CallStore(connect_redis(redis_url, ssl_cert_reqs, decode_responses=False))
            store.progress = ProgressSink(redis_url, ssl_cert_reqs)
            _stores[redis_url] = store
        return store
