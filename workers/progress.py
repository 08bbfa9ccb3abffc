"""A tool's progress on its turn's event stream: `ctx.progress(message, fraction=None)`.

Each report becomes a `tool_progress` event {call_id, tool, message, fraction} on `keys.turn_events`, in the
entry format of the orchestrator's events (`build_event_fields` is `orchestrator.store.codec`'s, written here
again because workers never import the orchestrator; a unit test holds the two equal). `call_id` is the
model's id of the call, as `tool_started` carries it: the worker knows the call by its wire id,
`<turn id>/<call id>`.

What a report may never do is fail or stall the tool, so:
- it is rate-limited per call: the first goes out at once, later ones `MIN_INTERVAL_S` apart (the interval
  doubles every `INTERVAL_DOUBLING_EVERY` events, up to `MAX_INTERVAL_S`). A report that comes too early is
  kept as the call's latest and goes out at the next allowed moment (a timer thread) or when the tool
  returns: the last state a tool reported is always shown, and events stay in the order they were reported;
- its message is redacted as the call's arguments are: the values of sensitive argument keys are replaced
  by the redaction marker wherever they appear, then the message is capped at `MESSAGE_MAX_CHARS`;
- it talks to Redis over a client of its own with a `SOCKET_TIMEOUT_S` timeout and no retries, so a frozen
  Redis holds the tool that long at most; after a failure, the call's progress is held back for
  `SUSPEND_S` (the latest report still goes out after that, if the tool is still running). Any exception is
  caught and logged once per call — except the errors a soft time limit raises, which are the tool's;
- `progress.lua` adds the event only while the turn's stream exists and the turn and the call have no
  outcome, so an expired turn gets no stream without TTL, `turn_finished` stays last, and nothing follows
  a call's `tool_finished`. Once it says no, the call reports nothing more.

Outside a turn (a direct call, `toolloop call`, `Tool.invoke` in a test) there is no reporter and a report
does nothing. A tool that never reports costs one small object per call and no round trip.

Design notes: docs/design/streaming.md, "Tool progress".
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers import keys, scripts
from workers.connect import DEFAULT_SSL_CERT_REQS, connect_redis
from workers.contract import REDACTED, ToolCallRequest, is_sensitive_key, redact

logger = logging.getLogger(__name__)

EVENT_NAME = "tool_progress"
# Four a second is as smooth as a progress bar needs to look, and keeps a chatty tool's events a small part
# of its turn's stream (capped at `keys.EVENTS_MAXLEN` entries, oldest trimmed first): a call reporting in a
# tight loop adds 240 events in its first minute, and the doubling keeps an hour-long one under ~1,500.
MIN_INTERVAL_S = 0.25
INTERVAL_DOUBLING_EVERY = 250
MAX_INTERVAL_S = 30.0
MESSAGE_MAX_CHARS = 1000
# Sensitive argument values shorter than this are not searched for in messages: replacing every "ab" or
# "42" would garble the message and hide nothing worth hiding.
MIN_SECRET_CHARS = 4
# A progress round trip takes well under a millisecond; one that takes this long finds Redis frozen.
SOCKET_TIMEOUT_S = 0.25
SUSPEND_S = 5.0
# `orchestrator.runtime.inbox.WIRE_CALL_ID_SEPARATOR` (a unit test holds them equal).
WIRE_CALL_ID_SEPARATOR = "/"
_DESCRIBE_MAX_CHARS = 200


# --- pure builders -----------------------------------------------------------------------------------------


def build_event_fields(name: str, data: Mapping[str, Any], now: float) -> dict[str, str]:
    """Stream fields of one event, as `orchestrator.store.codec.build_event_fields` builds them."""
    return {"name": name, "at": repr(now), "data": json.dumps(redact(dict(data)), default=str)}


def build_model_call_id(turn_id: str, wire_call_id: str) -> str:
    """The model's id of a call from its wire id (`<turn id>/<call id>`); another id as it is."""
    prefix = f"{turn_id}{WIRE_CALL_ID_SEPARATOR}"
    return wire_call_id[len(prefix) :] if wire_call_id.startswith(prefix) else wire_call_id


@dataclass(frozen=True)
class Secrets:
    """The sensitive argument values of a call, as one pattern (longest first), and the longest's length."""

    pattern: re.Pattern[str]
    longest: int


def _sensitive_leaves(value: Any, under_sensitive: bool) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _sensitive_leaves(item, under_sensitive or is_sensitive_key(str(key)))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _sensitive_leaves(item, under_sensitive)
    elif under_sensitive and isinstance(value, str | int | float) and not isinstance(value, bool):
        yield str(value)


def find_secrets(arguments: Mapping[str, Any]) -> Secrets | None:
    """The values `redact` hides in `arguments` (every leaf under a sensitive key, at any depth) of at least
    `MIN_SECRET_CHARS` characters; None when there are none."""
    found = {leaf for leaf in _sensitive_leaves(arguments, False) if len(leaf) >= MIN_SECRET_CHARS}
    if not found:
        return None
    ordered = sorted(found, key=len, reverse=True)
    return Secrets(re.compile("|".join(map(re.escape, ordered))), len(ordered[0]))


def build_message(message: object, secrets: Secrets | None) -> str:
    """A report's message as shown: as text, each secret replaced by the marker, at most
    `MESSAGE_MAX_CHARS` characters (cut ones end with "…").

    Replacing shortens the text, so it is redacted from the start until the shown length is reached: a
    secret cut by the cap can never be half shown, and a huge message costs no more than a short one.
    """
    raw = message if isinstance(message, str) else str(message)
    parts: list[str] = []
    size = pos = 0
    while pos < len(raw) and size <= MESSAGE_MAX_CHARS:
        budget = MESSAGE_MAX_CHARS + 1 - size
        # Any secret that starts within the budget ends before this window does.
        found = secrets.pattern.search(raw, pos, pos + budget + secrets.longest) if secrets else None
        if found is None:
            parts.append(raw[pos : pos + budget])
            pos += budget
            break
        parts += [raw[pos : found.start()], REDACTED]
        size += found.start() - pos + len(REDACTED)
        pos = found.end()
    shown = "".join(parts)
    if len(shown) > MESSAGE_MAX_CHARS:
        return shown[: MESSAGE_MAX_CHARS - 1] + "…"
    return shown


def build_fraction(fraction: object) -> float | None:
    """A report's fraction as shown: a float within 0..1; None for None, NaN, infinities and non-numbers
    (booleans included)."""
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        return None
    try:
        value = float(fraction)
    except (OverflowError, TypeError, ValueError):
        return None
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def build_progress_call(
    turn_id: str, wire_call_id: str, token: str, fields: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of `progress.lua`: the turn's keys and those of its call `wire_call_id` (`<turn id>/<call
    id>`, named with the turn: one slot on a Redis Cluster)."""
    script_keys = [
        keys.turn_events(turn_id),
        keys.turn_outcome(turn_id),
        keys.outcome(wire_call_id, turn_id),
        keys.fence(wire_call_id, turn_id),
    ]
    args = [token, str(keys.EVENTS_MAXLEN), fields["name"], fields["at"], fields["data"]]
    return script_keys, args


def _describe(exc: BaseException) -> str:
    # A message's own __str__ may have failed with anything in its text: only Redis's errors are quoted.
    if isinstance(exc, redis.RedisError):
        return f"{type(exc).__name__}: {str(exc)[:_DESCRIBE_MAX_CHARS]}"
    return type(exc).__name__


# --- the reporter of one call -------------------------------------------------------------------------------


class Cancellable(Protocol):
    """A scheduled callback (`threading.Timer`)."""

    def cancel(self) -> None: ...


def start_timer(delay_s: float, callback: Callable[[], None]) -> Cancellable:
    """Run `callback` in `delay_s` on a daemon thread (a tool's leftover report never holds its process)."""
    timer = threading.Timer(delay_s, callback)
    timer.daemon = True
    timer.start()
    return timer


Send = Callable[[Mapping[str, str]], scripts.ProgressResult]
# One report as made: its message as text, its fraction as given, when it was made (epoch seconds).
_Report = tuple[str, object, float]


class ProgressReporter:
    """The `tool_progress` events of one execution of a call: rate-limited, redacted, never raising."""

    def __init__(
        self,
        send: Send,
        *,
        call_id: str,
        tool: str,
        arguments: Mapping[str, Any],
        passthrough: tuple[type[BaseException], ...] = (),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        schedule: Callable[[float, Callable[[], None]], Cancellable] = start_timer,
    ) -> None:
        self._send = send
        self.call_id = call_id
        self.tool = tool
        self._arguments = arguments
        self._passthrough = passthrough
        self._clock = clock
        self._wall_clock = wall_clock
        self._schedule = schedule
        self._lock = threading.Lock()
        self._secrets: Secrets | None = None
        self._secrets_found = False
        self._pending: _Report | None = None
        self._timer: Cancellable | None = None
        self._next_at = -math.inf
        self._suspended_until = -math.inf
        self._sent = 0
        self._closed = False
        self._warned = False
        self.dropped = 0

    def report(self, message: object, fraction: object = None) -> None:
        """Emit (or keep as the latest, until it may go out) one progress event; never raises, except the
        `passthrough` errors (a soft time limit's)."""
        try:
            # Only what may change later is taken now; a report that waits is redacted and encoded when it
            # goes, so a tool reporting in a tight loop pays microseconds per report.
            text = message if isinstance(message, str) else str(message)
            report = (text, fraction, self._wall_clock())
            with self._lock:
                if self._closed:
                    return
                if self._pending is not None:
                    self.dropped += 1  # superseded before it could go out
                self._pending = report
                self._send_or_wait()
        except self._passthrough:
            raise
        except Exception as exc:
            self._note_failure(exc)

    def close(self) -> None:
        """The tool returned: send the latest report still waiting (unless Redis just failed), then nothing
        more. Never raises, except the `passthrough` errors."""
        try:
            with self._lock:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if not self._closed and self._clock() >= self._suspended_until:
                    self._flush()
                elif self._pending is not None:
                    self.dropped += 1
                self._pending = None
                self._closed = True
        except self._passthrough:
            raise
        except Exception as exc:
            self._note_failure(exc)

    def _build(self, report: _Report) -> dict[str, str]:
        message, fraction, at = report
        if not self._secrets_found:
            self._secrets, self._secrets_found = find_secrets(self._arguments), True
        data = {
            "call_id": self.call_id,
            "tool": self.tool,
            "message": build_message(message, self._secrets),
            "fraction": build_fraction(fraction),
        }
        return build_event_fields(EVENT_NAME, data, at)

    def _interval_s(self) -> float:
        doublings = min(self._sent // INTERVAL_DOUBLING_EVERY, 16)
        return min(MAX_INTERVAL_S, MIN_INTERVAL_S * float(2**doublings))

    def _send_or_wait(self) -> None:
        # Under the lock: the pending report goes now if it may, else a timer sends it when it may.
        wait_s = max(self._next_at, self._suspended_until) - self._clock()
        if wait_s <= 0:
            self._flush()
        elif self._timer is None:
            self._timer = self._schedule(wait_s, self._on_timer)

    def _on_timer(self) -> None:
        try:
            with self._lock:
                self._timer = None
                if not self._closed and self._pending is not None:
                    self._send_or_wait()
        except Exception as exc:
            self._note_failure(exc)

    def _flush(self) -> None:
        # Under the lock.
        report, self._pending = self._pending, None
        if report is None:
            return
        fields = self._build(report)
        self._sent += 1
        self._next_at = self._clock() + self._interval_s()
        try:
            result = self._send(fields)
        except self._passthrough:
            raise
        except Exception as exc:
            # Redis down, frozen, read-only or out of memory: hold the call's reports back for a while.
            self._suspended_until = self._clock() + SUSPEND_S
            self._note_failure(exc)
            return
        if result is not scripts.ProgressResult.ADDED:
            self._closed = True
            logger.debug("%s: progress no longer shown (%s)", self.call_id, result.name)

    def _note_failure(self, exc: BaseException) -> None:
        self.dropped += 1
        if self._warned:
            logger.debug("%s: progress event dropped: %s", self.call_id, _describe(exc))
            return
        self._warned = True
        logger.warning(
            "%s: progress event dropped (%s); the tool goes on, and later drops of this call are not logged",
            self.call_id,
            _describe(exc),
        )


# --- where the events go: the worker's Redis, over a client of its own --------------------------------------

_FAST_OPTIONS = {"socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": SOCKET_TIMEOUT_S}


def use_fast_connections(client: redis.Redis) -> None:
    """Make every connection `client` opens from now on give up after `SOCKET_TIMEOUT_S`, and never retry.

    Set on the pools, not only passed as options: a URL's own `?socket_timeout=` wins over those, and one
    retry would double how long a frozen Redis holds the tool. A Redis Cluster client has a pool per node,
    opens the nodes it learns of later with its nodes manager's options, has already connected to read the
    slot map, and retries at its own level (its nodes' connections never do): each is set.
    """
    if isinstance(client, redis.cluster.RedisCluster):
        client.nodes_manager.connection_kwargs.update(_FAST_OPTIONS)
        for node in client.get_nodes():
            if node.redis_connection is not None:
                pool = node.redis_connection.connection_pool
                pool.connection_kwargs.update(_FAST_OPTIONS)
                pool.disconnect()  # the slot map's connection was opened with the URL's timeouts
        client.set_retry(Retry(NoBackoff(), 0))
        return
    client.connection_pool.connection_kwargs.update(**_FAST_OPTIONS, retry=Retry(NoBackoff(), 0))


class ProgressSink:
    """The process's way to a Redis for progress events: connected on the first report, short timeouts."""

    def __init__(self, redis_url: str, ssl_cert_reqs: str = DEFAULT_SSL_CERT_REQS) -> None:
        self.redis_url = redis_url
        self.ssl_cert_reqs = ssl_cert_reqs
        self._lock = threading.Lock()
        self._script: Any = None

    def _connect(self) -> Any:
        with self._lock:
            if self._script is None:
                client = connect_redis(
                    self.redis_url,
                    self.ssl_cert_reqs,
                    decode_responses=False,
                    socket_timeout=SOCKET_TIMEOUT_S,
                    socket_connect_timeout=SOCKET_TIMEOUT_S,
                )
                use_fast_connections(client)
                self._script = client.register_script(scripts.PROGRESS.source)
            return self._script

    def append(
        self, turn_id: str, wire_call_id: str, token: str, fields: Mapping[str, str]
    ) -> scripts.ProgressResult:
        """Run `progress.lua` for one event of the execution holding `token`."""
        script = self._script if self._script is not None else self._connect()
        script_keys, args = build_progress_call(turn_id, wire_call_id, token, fields)
        return scripts.ProgressResult(int(script(keys=script_keys, args=args)))

    def reporter(
        self,
        request: ToolCallRequest,
        *,
        token: str,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> ProgressReporter | None:
        """The reporter of one execution of `request`; None outside a turn (progress is then a no-op)."""
        turn_id = request.turn_id
        if turn_id is None:
            return None

        def send(fields: Mapping[str, str]) -> scripts.ProgressResult:
            return self.append(turn_id, request.call_id, token, fields)

        return ProgressReporter(
            send,
            call_id=build_model_call_id(turn_id, request.call_id),
            tool=request.tool,
            arguments=request.arguments,
            passthrough=passthrough,
        )
