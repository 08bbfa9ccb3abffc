"""What a Redis error means, and how long to wait before trying again: the one rule every process uses.

Every place that meets a Redis error — the orchestrator's loops, the API, the clients, the pool children, the
broker channels — catches the whole family (`REDIS_ERRORS`, or `redis.RedisError`) and asks `classify`:

    classify(exc) -> RedisErrorClass(kind, code, transient) | None (not a Redis failure)

    kind             transient  what Redis says                                      codes, redis-py classes
    unreachable      yes        the connection is lost, refused, timed out, or none  ConnectionError,
                                is free (a restart, a network cut, a full pool)      TimeoutError, OSError
    failover         yes        a master demoted (a blocked read on it unblocked     READONLY, MASTERDOWN,
                                too), a replica without its master, a master short  NOREPLICAS, UNBLOCKED
                                of replicas
    out of memory    yes        `maxmemory` reached under `noeviction`: writes        OOM
                                refused until something frees memory
    loading          yes        Redis is loading its data after a restart, or busy   LOADING, BUSY
                                running a script
    cluster moving   yes        a slot moving between masters, a cluster without a   MOVED, ASK, TRYAGAIN,
                                majority                                             CLUSTERDOWN
    cannot persist   yes        a failed background save: writes refused until one   MISCONF
                                succeeds (`stop-writes-on-bgsave-error`)
    access denied    no         a wrong password, or a user without the right: a     WRONGPASS, NOAUTH, NOPERM
                                change of configuration mends it, not a wait
    no script        no         Redis forgot a script (a restart, SCRIPT FLUSH): the  NOSCRIPT
                                caller loads it again (redis-py's `Script` does)
    script error     no         a Lua script failed: a bug                           ERR … script …
    wrong command    no         a command Redis will never take: a wrong type, a     WRONGTYPE, CROSSSLOT,
                                syntax error, an unknown command; any other error    EXECABORT, ERR …

A refusal met inside a Lua script comes as the script's error on Redis < 7 (`ERR Error running script …:
@user_script:9: -OOM command not allowed …`), the refused command's code after a dash; in a pipeline as
redis-py's "Command # 1 (…) of pipeline caused error: …". `classify` finds the code there too, so the
refusal is the kind it names, not a script error. A `redis.RedisError` wrapped by kombu (its
`OperationalError` of a publish it gave up) is found behind the wrapper (`find_redis_error`).

How to back off is `build_backoff_s`: capped exponential with equal jitter, the pause after `n` failures in a
row drawn from (step/2, step], step = `first_s` doubled `n - 1` times, capped at `cap_s`. Equal jitter rather
than full jitter (0 to step): a pause never drops below half its step, so a loop that keeps failing still
slows down as failures add up and never spins against a Redis that is down, while the processes that all
lost Redis at the same moment (a restart, a failover) spread their next tries over half of each step instead
of coming back in the same millisecond. Its upper bound is the pause without jitter, so no wait is longer than
the plain doubling: a deadline computed from it still holds.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import redis.exceptions as rx

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_FIRST_S",
    "REDIS_ERRORS",
    "Backoff",
    "RedisErrorClass",
    "RedisErrorKind",
    "build_backoff_s",
    "classify",
    "find_redis_error",
    "is_bug",
    "is_cluster_reply",
    "is_transient",
    "maybe_ran",
]

REDIS_ERRORS: tuple[type[Exception], ...] = (rx.RedisError, rx.RedisClusterException, OSError)
"""What a Redis call raises when Redis fails (OSError: a socket error redis-py did not wrap;
`RedisClusterException`: what redis-py's cluster client raises of its own, a slot no node covers or no node
reachable, which is no `RedisError`)."""

BACKOFF_FIRST_S = 0.1
BACKOFF_CAP_S = 2.0
# Doubling stops being useful long before a float overflows (2.0 ** 1024 raises): an outage of hours counts
# thousands of failures in a row.
_MAX_DOUBLINGS = 32


class RedisErrorKind(StrEnum):
    """What a Redis error says about Redis: the value a caller branches on and an operator reads."""

    UNREACHABLE = "unreachable"
    FAILOVER = "failover"
    OUT_OF_MEMORY = "out of memory"
    LOADING = "loading"
    CLUSTER_MOVING = "cluster moving"
    CANNOT_PERSIST = "cannot persist"
    ACCESS_DENIED = "access denied"
    NO_SCRIPT = "no script"
    SCRIPT_ERROR = "script error"
    WRONG_COMMAND = "wrong command"

    @property
    def transient(self) -> bool:
        """True when the same call may succeed later, Redis unchanged by us: wait and try again."""
        return self in _TRANSIENT

    @property
    def bug(self) -> bool:
        """True when the call itself is wrong (a script error, a wrong command): no retry ever mends it."""
        return self in (RedisErrorKind.SCRIPT_ERROR, RedisErrorKind.WRONG_COMMAND)

    @property
    def refusal(self) -> bool:
        """True when Redis answered and refused the call for a while (full, read-only, loading, unable to
        persist): reached, not out of reach."""
        return self in _TRANSIENT and self not in (RedisErrorKind.UNREACHABLE, RedisErrorKind.CLUSTER_MOVING)


_TRANSIENT = frozenset(
    {
        RedisErrorKind.UNREACHABLE,
        RedisErrorKind.FAILOVER,
        RedisErrorKind.OUT_OF_MEMORY,
        RedisErrorKind.LOADING,
        RedisErrorKind.CLUSTER_MOVING,
        RedisErrorKind.CANNOT_PERSIST,
    }
)


@dataclass(frozen=True)
class RedisErrorClass:
    """What one Redis error means: its kind, the error code Redis sent (None for a lost connection, or an
    error with no code), and whether waiting mends it."""

    kind: RedisErrorKind
    code: str | None = None

    @property
    def transient(self) -> bool:
        """True when the same call may succeed later: wait (`build_backoff_s`) and try again."""
        return self.kind.transient

    @property
    def bug(self) -> bool:
        """True when the call itself is wrong: raise it, never retry it."""
        return self.kind.bug

    @property
    def reconnect(self) -> bool:
        """True when a new connection is what mends it: the connection is lost, or it leads to a master a
        failover demoted (READONLY, UNBLOCKED; redis-py's Sentinel client drops such a connection for that
        reason).
        Any other transient refusal ends on the same connection."""
        return self.kind is RedisErrorKind.UNREACHABLE or self.code in ("READONLY", "UNBLOCKED")

    @property
    def maybe_ran(self) -> bool:
        """True when the command may have run though it raised: its reply was lost (a lost connection, a
        timeout). Any error Redis answered with means it did not."""
        return self.kind is RedisErrorKind.UNREACHABLE


# The first word of Redis's error reply, and what it means.
_KIND_OF_CODE: dict[str, RedisErrorKind] = {
    "READONLY": RedisErrorKind.FAILOVER,
    "MASTERDOWN": RedisErrorKind.FAILOVER,
    "NOREPLICAS": RedisErrorKind.FAILOVER,
    # "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)": a
    # blocking read (BLPOP, XREAD BLOCK) on a master a failover demoted.
    "UNBLOCKED": RedisErrorKind.FAILOVER,
    "OOM": RedisErrorKind.OUT_OF_MEMORY,
    "LOADING": RedisErrorKind.LOADING,
    "BUSY": RedisErrorKind.LOADING,
    "MOVED": RedisErrorKind.CLUSTER_MOVING,
    "ASK": RedisErrorKind.CLUSTER_MOVING,
    "TRYAGAIN": RedisErrorKind.CLUSTER_MOVING,
    "CLUSTERDOWN": RedisErrorKind.CLUSTER_MOVING,
    "MISCONF": RedisErrorKind.CANNOT_PERSIST,
    "WRONGPASS": RedisErrorKind.ACCESS_DENIED,
    "NOAUTH": RedisErrorKind.ACCESS_DENIED,
    "NOPERM": RedisErrorKind.ACCESS_DENIED,
    "NOSCRIPT": RedisErrorKind.NO_SCRIPT,
    "WRONGTYPE": RedisErrorKind.WRONG_COMMAND,
    "CROSSSLOT": RedisErrorKind.WRONG_COMMAND,
    "EXECABORT": RedisErrorKind.WRONG_COMMAND,
}

# redis-py's classes for the codes it parses (it strips the code from the message), most specific first:
# MasterDownError is a ClusterDownError, MovedError an AskError, BusyLoadingError and AuthenticationError
# are ConnectionErrors. An error built by redis-py without a reply (a timeout, a full pool) has no code.
_CODE_OF_CLASS: tuple[tuple[type[Exception], str | None, RedisErrorKind], ...] = (
    (rx.AuthenticationError, "WRONGPASS", RedisErrorKind.ACCESS_DENIED),
    (rx.AuthorizationError, "NOPERM", RedisErrorKind.ACCESS_DENIED),
    (rx.NoPermissionError, "NOPERM", RedisErrorKind.ACCESS_DENIED),
    (rx.BusyLoadingError, "LOADING", RedisErrorKind.LOADING),
    (rx.ConnectionError, None, RedisErrorKind.UNREACHABLE),
    (rx.TimeoutError, None, RedisErrorKind.UNREACHABLE),
    (rx.OutOfMemoryError, "OOM", RedisErrorKind.OUT_OF_MEMORY),
    (rx.ReadOnlyError, "READONLY", RedisErrorKind.FAILOVER),
    (rx.MasterDownError, "MASTERDOWN", RedisErrorKind.FAILOVER),
    (rx.MovedError, "MOVED", RedisErrorKind.CLUSTER_MOVING),
    (rx.AskError, "ASK", RedisErrorKind.CLUSTER_MOVING),
    (rx.TryAgainError, "TRYAGAIN", RedisErrorKind.CLUSTER_MOVING),
    (rx.ClusterDownError, "CLUSTERDOWN", RedisErrorKind.CLUSTER_MOVING),
    # A cluster client that ran out of redirections ("TTL exhausted") or found no node for a slot.
    (rx.ClusterError, None, RedisErrorKind.CLUSTER_MOVING),
    (rx.SlotNotCoveredError, None, RedisErrorKind.CLUSTER_MOVING),
    (rx.NoScriptError, "NOSCRIPT", RedisErrorKind.NO_SCRIPT),
    (rx.ClusterCrossSlotError, "CROSSSLOT", RedisErrorKind.WRONG_COMMAND),
    (rx.ExecAbortError, "EXECABORT", RedisErrorKind.WRONG_COMMAND),
    (OSError, None, RedisErrorKind.UNREACHABLE),
)

# A code inside a message: at its start, or after a dash (a refusal inside a script on Redis < 7); a whole
# word, so BUSYGROUP is not BUSY.
_CODE_IN_TEXT = re.compile(r"(?:^|-)(" + "|".join(_KIND_OF_CODE) + r")\b")
# redis-py's prefix on a pipeline's error, which quotes the command (its arguments are not codes).
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)
# What redis-py leaves of a refusal once it strips the code (a pipeline's error quotes only the message).
_TEXT_OF_CODE = (
    ("used memory > 'maxmemory'", "OOM"),
    ("You can't write against a read only replica", "READONLY"),
)
# What redis-py's cluster client says of its own (a `RedisClusterException`, with no code) when the cluster,
# not the call, is at fault; any other is a wrong call.
_CLUSTER_TEXT = (
    # A node that is no cluster's (TOOLLOOP_REDIS_CLUSTER on against one Redis), inside "cannot be connected".
    ("Cluster mode is not enabled", RedisErrorKind.WRONG_COMMAND),
    ("cannot be connected", RedisErrorKind.UNREACHABLE),
    ("has no redis_connection", RedisErrorKind.UNREACHABLE),
    ("slots are not covered", RedisErrorKind.CLUSTER_MOVING),
    ("could not agree on a valid slots cache", RedisErrorKind.CLUSTER_MOVING),
)
# Redis's words for a script that failed by itself (Redis 7: "… script: <sha>, on @user_script:3.").
_SCRIPT_TEXT = re.compile(r"user_script|Error running script|Error compiling script|script: [0-9a-f]{40}")


def find_redis_error(exc: object) -> BaseException | None:
    """The Redis failure behind `exc` (pure): itself, or the `redis.RedisError` kombu wrapped in its
    `OperationalError` or `ConnectionError` when it gave a publish up, else a socket error (`OSError`) in the
    chain; None when there is none."""
    chain: list[BaseException] = []
    while isinstance(exc, BaseException) and len(chain) < 8:  # a chain is short; a cycle must not loop
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    found = next((e for e in chain if isinstance(e, (rx.RedisError, rx.RedisClusterException))), None)
    return found if found is not None else next((e for e in chain if isinstance(e, OSError)), None)


def classify(exc: BaseException) -> RedisErrorClass | None:
    """What `exc` says about Redis (pure): None when no Redis failure is behind it (see the module's table).

    The code Redis sent decides (the one redis-py parsed, else one found in the message), then redis-py's
    class; a Redis error of no known code or class is a wrong command (a bug)."""
    found = find_redis_error(exc)
    if found is None:
        return None
    code = _find_code(found)
    if code is not None:
        return RedisErrorClass(_KIND_OF_CODE[code], code)
    for cls, class_code, kind in _CODE_OF_CLASS:
        if isinstance(found, cls):
            return RedisErrorClass(kind, class_code)
    if isinstance(found, rx.RedisClusterException):
        text = str(found)
        kind = next((k for words, k in _CLUSTER_TEXT if words in text), RedisErrorKind.WRONG_COMMAND)
        return RedisErrorClass(kind, None)
    if _SCRIPT_TEXT.search(str(found)):
        return RedisErrorClass(RedisErrorKind.SCRIPT_ERROR, "ERR")
    status = getattr(found, "status_code", None)
    first = str(found).split(" ", 1)[0]
    code = status if isinstance(status, str) else first if first.isupper() and first.isalpha() else None
    return RedisErrorClass(RedisErrorKind.WRONG_COMMAND, code)


def _find_code(exc: BaseException) -> str | None:
    # redis-py keeps the code it parsed (`status_code`) but strips it from the message; a code it does not
    # parse (BUSY, MISCONF, WRONGTYPE…) stays at the start of the message.
    status = getattr(exc, "status_code", None)
    if status in _KIND_OF_CODE:
        return str(status)
    if not isinstance(exc, rx.ResponseError):
        return None
    text = _PIPELINE_PREFIX.sub("", str(exc), count=1)
    match = _CODE_IN_TEXT.search(text)
    if match is not None:
        return match.group(1)
    return next((code for words, code in _TEXT_OF_CODE if words in text), None)


def is_transient(exc: BaseException) -> bool:
    """True when `exc` is a Redis failure that waiting mends (pure): retry it after `build_backoff_s`."""
    meaning = classify(exc)
    return meaning is not None and meaning.transient


def is_cluster_reply(exc: BaseException) -> bool:
    """True when `exc` is a reply only a Redis Cluster's node gives (pure): MOVED, ASK, TRYAGAIN,
    CLUSTERDOWN, CROSSSLOT. To a client that takes its Redis for one Redis it says that Redis is a node of a
    cluster: a configuration mistake no wait mends."""
    meaning = classify(exc)
    return meaning is not None and meaning.code in ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "CROSSSLOT")


def is_bug(exc: BaseException) -> bool:
    """True when `exc` is a Redis error that says the call itself is wrong (a script error, a wrong
    command) (pure): raise it; never retry it, never keep its work for later."""
    meaning = classify(exc)
    return meaning is not None and meaning.bug


def maybe_ran(exc: BaseException) -> bool:
    """True when the Redis call that raised `exc` may have run all the same (its reply lost) (pure): a write
    retried after it must expect to find itself done."""
    meaning = classify(exc)
    return meaning is None or meaning.maybe_ran


def build_backoff_s(
    failures: int,
    *,
    first_s: float = BACKOFF_FIRST_S,
    cap_s: float = BACKOFF_CAP_S,
    rand: Callable[[], float] = random.random,
) -> float:
    """The pause after `failures` failures in a row (pure but for `rand`, a draw in [0, 1)): its step is
    `first_s` doubled `failures - 1` times, capped at `cap_s`; the pause is in (step/2, step] (equal jitter).

    `rand() == 0` gives the step itself, the longest pause."""
    step = min(cap_s, first_s * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS))
    return step - step / 2 * rand()


class Backoff:
    """The failures in a row of one loop: `next_s()` after each failure, `reset()` after a success."""

    def __init__(
        self,
        first_s: float = BACKOFF_FIRST_S,
        cap_s: float = BACKOFF_CAP_S,
        *,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        self._rand = rand
        self.failures = 0

    def next_s(self) -> float:
        """Count a failure; the pause before the next try (`build_backoff_s`)."""
        self.failures += 1
        return build_backoff_s(self.failures, first_s=self.first_s, cap_s=self.cap_s, rand=self._rand)

    def reset(self) -> None:
        """The loop's call succeeded: the next failure pauses briefly again."""
        self.failures = 0
