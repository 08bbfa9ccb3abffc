"""The Redis side of executing a call (SPEC §4.8–§4.9): the scripts a pool child runs and `CallStore`.

One start script per execution does the redelivery dedupe, the running guard, the attempt count and the
"started" notification in a single round trip; one pipeline writes the outcome and its companions. Every
step takes an optional `RedisRetry` (workers.redis_retry) and is safe to repeat after a lost reply: the
start script knows its execution's token, the idempotency claim its call id, and a repeated outcome write
first looks whether the earlier try's outcome landed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from workers import keys
from workers.connect import DEFAULT_SSL_CERT_REQS, connect_redis
from workers.contract import ToolCallRequest, ToolOutcome
from workers.redis_retry import RedisRetry

ATTEMPTS_TTL_S = keys.OUTCOME_TTL_S

# KEYS: outcome, running, attempts, turn lease ('' when none).
# ARGV: running token, running TTL ms, attempts TTL s, inbox prefix, call id, turn id, worker, started at.
# Returns {-1, 0} when the call already has an outcome, {-2, pttl} when another execution holds it,
# else {attempt, 0} after notifying the turn's owner that the call started. The token is unique per
# execution: finding it already set means this execution's first try ran and only its reply was lost.
START_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {tonumber(redis.call('GET', KEYS[3]) or '1'), 0}
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return {-2, redis.call('PTTL', KEYS[2])}
end
local n = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
if KEYS[4] ~= '' then
  local owner = redis.call('GET', KEYS[4])
  if owner then
    redis.call('XADD', ARGV[4] .. owner, 'MAXLEN', '~', '100000', '*', 'kind', 'started',
               'turn', ARGV[6], 'call', ARGV[5], 'attempt', tostring(n), 'worker', ARGV[7], 'at', ARGV[8])
  end
end
return {n, 0}
"""

# KEYS: idempotency record, its lock. ARGV: call id (the lock's holder), lock TTL ms.
# Returns {1, record} for a stored success, {0, ''} when this call holds the lock (now, or already: a
# redelivery of the same call), {2, pttl} when another call holds it.
CLAIM_IDEMPOTENCY_LUA = """
local record = redis.call('GET', KEYS[1])
if record then return {1, record} end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return {2, tostring(redis.call('PTTL', KEYS[2]))} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
return {0, ''}
"""

# KEYS: running guard or idempotency lock. ARGV: token ('' deletes whatever holds it). Deletes only our own.
RELEASE_LUA = """
if ARGV[1] == '' or redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class CallStore:
    """The Redis side of executing calls: one per process, its scripts registered once."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = client.register_script(START_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._claim = client.register_script(CLAIM_IDEMPOTENCY_LUA)
        self._write = client.register_script(keys.WRITE_OUTCOME_LUA)

    def start(
        self,
        request: ToolCallRequest,
        *,
        token: str,
        running_ttl_s: float,
        worker: str,
        retry: RedisRetry | None = None,
    ) -> tuple[int, int]:
        """Run the start script: (attempt, 0), (-1, 0) already finished, (-2, pttl ms) held elsewhere.

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
                ],
            )

        result = retry.call(once, "the start of a call") if retry is not None else once(0)
        return int(result[0]), int(result[1])

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
                script_keys, script_args = keys.build_write_outcome_call(
                    outcome.call_id, outcome.turn_id, outcome_json, reply_key
                )
                self._write(keys=script_keys, args=script_args, client=pipe)
            if token is not None:
                self._release(keys=[keys.running(outcome.call_id)], args=[token], client=pipe)
            if idempotency_lock is not None:
                self._release(keys=[idempotency_lock], args=[outcome.call_id], client=pipe)
            results = pipe.execute()
            return landed or bool(results[won_index])

        return retry.call(once, f"the outcome of {outcome.call_id}") if retry is not None else once(0)

    def claim_idempotency(
        self, key: str, *, call_id: str, lock_ttl_s: float, retry: RedisRetry | None = None
    ) -> tuple[int, str | None]:
        """(1, stored success JSON); (0, None): `call_id` holds the key's lock; (2, None): another does.

        With `retry`, tried again while Redis is unavailable (the claim is safe to repeat per call id)."""

        def once(_failures: int) -> Any:
            return self._claim(keys=[key, keys.idempotency_lock(key)], args=[call_id, int(lock_ttl_s * 1000)])

        state, value = retry.call(once, "an idempotency claim") if retry is not None else once(0)
        record = value.decode("utf-8") if isinstance(value, bytes) else value
        return int(state), (record if int(state) == 1 else None)

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
