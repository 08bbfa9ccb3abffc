"""The Redis side of executing a call (SPEC §4.8–§4.9): `CallStore`, over the scripts of `workers.scripts`.

One start script per execution (`start.lua`) does the redelivery dedupe, the running guard, the attempt
count and the "started" notification in a single round trip; one pipeline writes the outcome and its
companions. Every step takes an optional `RedisRetry` (workers.redis_retry) and is safe to repeat after a
lost reply: the start script knows its execution's token, the idempotency claim its call id, and a repeated
outcome write first looks whether the earlier try's outcome landed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from workers import keys, scripts
from workers.connect import DEFAULT_SSL_CERT_REQS, connect_redis
from workers.contract import ToolCallRequest, ToolOutcome
from workers.redis_retry import RedisRetry

ATTEMPTS_TTL_S = keys.OUTCOME_TTL_S


class CallStore:
    """The Redis side of executing calls: one per process, its scripts registered once."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = client.register_script(scripts.START.source)
        self._release = client.register_script(scripts.RELEASE.source)
        self._claim = client.register_script(scripts.CLAIM_IDEMPOTENCY.source)
        self._write = client.register_script(scripts.WRITE_OUTCOME.source)

    def start(
        self,
        request: ToolCallRequest,
        *,
        token: str,
        running_ttl_s: float,
        worker: str,
        retry: RedisRetry | None = None,
    ) -> tuple[int, int]:
        """Run the start script: (attempt, 0) when started, (StartResult.FINISHED, 0) when the call already
        has an outcome, (StartResult.HELD, pttl ms) when another execution holds it.

        With `retry`, tried again while Redis is unavailable (the script is safe to repeat per token).
        """
        lease = keys.turn_lease(request.turn_id) if request.turn_id else ""

        def once(_failures: int) -> Any:
            return self._start(
                keys=[
                    keys.outcome(request.call_id),
                    keys.running(request.call_id),
                    keys.attempts(request.call_id),
                    lease,
                ],
                args=[
                    token,
                    int(running_ttl_s * 1000),
                    ATTEMPTS_TTL_S,
                    keys.INBOX_PREFIX,
                    request.call_id,
                    request.turn_id or "",
                    worker,
                    f"{time.time():.3f}",
                    keys.INBOX_MAXLEN,
                ],
            )

        reply = retry.call(once, "the start of a call") if retry is not None else once(0)
        return scripts.parse_start_reply(reply)

    def finish(
        self,
        outcome: ToolOutcome,
        *,
        reply_key: str | None,
        token: str | None,
        full_result_json: str | None = None,
        idempotency: tuple[str, str] | None = None,
        idempotency_lock: str | None = None,
        retry: RedisRetry | None = None,
    ) -> bool:
        """Write the outcome (first writer wins), the full result and idempotency record; drop the guard
        and the call's idempotency lock.

        One pipeline, one round trip. Returns True when this outcome won. The stored success is set before
        the lock goes, so a waiting identical call always finds one or the other. With `retry`, written
        again while Redis is unavailable; a try after a failed one first looks whether the failed one's
        outcome landed (its reply was lost), so it is neither written twice nor filed as a late duplicate.
        """
        outcome_json = outcome.model_dump_json()

        def once(failures: int) -> bool:
            landed = failures > 0 and self.client.get(keys.outcome(outcome.call_id)) == outcome_json.encode()
            pipe = self.client.pipeline(transaction=False)
            if full_result_json is not None and outcome.full_result_key:
                pipe.set(outcome.full_result_key, full_result_json, ex=keys.FULL_RESULT_TTL_S)
            if idempotency is not None:
                pipe.set(idempotency[0], idempotency[1], ex=keys.IDEMPOTENCY_TTL_S)
            won_index = len(pipe)
            if not landed:
                script_keys, script_args = scripts.build_write_outcome_call(
                    outcome.call_id, outcome.turn_id, outcome_json, reply_key
                )
                self._write(keys=script_keys, args=script_args, client=pipe)
            if token is not None:
                self._release(keys=[keys.running(outcome.call_id)], args=[token], client=pipe)
            if idempotency_lock is not None:
                self._release(keys=[idempotency_lock], args=[outcome.call_id], client=pipe)
            results = pipe.execute()
            return landed or scripts.parse_write_result(results[won_index]) is scripts.WriteResult.WON

        return retry.call(once, f"the outcome of {outcome.call_id}") if retry is not None else once(0)

    def claim_idempotency(
        self, key: str, *, call_id: str, lock_ttl_s: float, retry: RedisRetry | None = None
    ) -> tuple[scripts.IdempotencyClaim, str | None]:
        """(STORED, stored success JSON); (CLAIMED, None): `call_id` holds the key's lock; (BUSY, None):
        another call does.

        With `retry`, tried again while Redis is unavailable (the claim is safe to repeat per call id)."""

        def once(_failures: int) -> Any:
            return self._claim(keys=[key, keys.idempotency_lock(key)], args=[call_id, int(lock_ttl_s * 1000)])

        reply = retry.call(once, "an idempotency claim") if retry is not None else once(0)
        return scripts.parse_idempotency_claim(reply)

    def release_idempotency_lock(self, key: str, call_id: str) -> None:
        """Drop the lock on an idempotency key if `call_id` holds it."""
        self._release(keys=[keys.idempotency_lock(key)], args=[call_id])

    def release(self, call_id: str, token: str) -> None:
        """Drop the running guard if `token` holds it ('' drops it whoever holds it)."""
        self._release(keys=[keys.running(call_id)], args=[token])

    def read_attempts(self, call_id: str) -> int:
        """How many executions of the call have started."""
        value = self.client.get(keys.attempts(call_id))
        return int(value) if value is not None else 0

    def read_outcome(self, call_id: str) -> ToolOutcome | None:
        """The call's winning outcome, if any."""
        raw = self.client.get(keys.outcome(call_id))
        return ToolOutcome.model_validate_json(raw) if raw is not None else None


_stores: dict[str, CallStore] = {}
_stores_lock = threading.Lock()


def get_store(redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS) -> CallStore:
    """The process's CallStore for `redis_url` (redis-py pools reconnect by themselves after a fork)."""
    with _stores_lock:
        store = _stores.get(redis_url)
        if store is None:
            store = CallStore(connect_redis(redis_url, ssl_cert_reqs, decode_responses=False))
            _stores[redis_url] = store
        return store
