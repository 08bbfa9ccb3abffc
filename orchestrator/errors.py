"""toolloop's one error tree.

Outcomes are values, not exceptions: a tool call ends as a `ToolOutcome`, a model call that failed as a
`ProviderError` value, a turn as a `TurnOutcome`. Exceptions are for bad input at the edges, programming
errors, and the few things a caller must handle:

    ToolloopError(Exception)                 workers.errors: the root, in the leaf package
    ├── ToolDefinitionError(ValueError)      workers.errors: a bad @tool, at import time
    │   └── McpConfigError                   workers.errors: a bad TOOLLOOP_MCP_SERVERS entry or mcp_server()
    ├── ToolModuleError(ImportError)         workers.errors: a tool module a worker could not import
    ├── TransientToolError                   workers.errors: raised by a tool to be retried
    ├── InvalidResultError(ValueError)       workers.errors: a tool result JSON cannot carry
    ├── ToolCallFailed                       workers.errors: the tool task's end after a failure outcome
    ├── ToolCallRetried                      workers.errors: why a tool task is retried (seen in Flower)
    ├── McpToolError                         workers.errors: an MCP server answered a call with isError
    ├── RedisConfigError(ValueError)         workers.errors: a Redis URL that cannot be used as configured
    ├── UnknownTurnError(LookupError)        no turn with this id (never submitted, or expired)
    ├── CallNotWaitingError(LookupError)     an approval for a call that waits for none (unknown, decided)
    ├── UnknownToolError(ValueError)         a submitted turn names tools no live worker serves
    ├── UnknownAgentError(ValueError)        a turn names an agent nobody declared or registered
    ├── StateVersionError(ValueError)        a stored turn state of a version this code does not read
    ├── MalformedBody(ValueError)            a provider body not of its wire format (`where` says where)
    ├── EventStreamError(ValueError)         bytes not AWS event-stream frames (`cut`: it ended inside one)
    ├── ModelConfigError(ValueError)         an unknown provider, tier or model name, or no server for it
    ├── ApiKeysError(ValueError)             TOOLLOOP_API_KEYS is not a table of keys the API can use
    ├── RedisUnavailableError                a client's retries ran out: Redis did not answer in time
    │     (redis.ConnectionError, TimeoutError)
    ├── ApiUnavailableError(TimeoutError)    an HTTP client's retries ran out: the API did not answer in time
    ├── ApiAuthError(PermissionError)        the HTTP API refused the client's token (401, 403)
    └── OpsError(RuntimeError)               the local tooling (ops/) could not do its job
        ├── RedisServerError                 no redis-server, or it did not answer in time
        │   └── PortUnavailableError         our redis-server could not serve its port
        ├── DemoError                        a part of the demo did not start, or its turn did not end
        └── BenchError                       a benchmark scenario could not produce its figure

Each also derives from the builtin a caller would catch without knowing toolloop (`ValueError` for bad
input, `LookupError` for a missing turn), so `except ValueError` keeps working. Redis and httpx errors are
not wrapped: the store lets `redis.RedisError` through (a caller retries or reports it), and the providers map
httpx errors into `ProviderError` values at once — except where a client rides out an outage
(`store.runner.Patience`): when its patience runs out it raises `RedisUnavailableError`, still a
`redis.ConnectionError` (and a `TimeoutError`: the caller's time ran out), whose message names the URL.
The HTTP clients (`client.http_client`) do the same over the API: `ApiUnavailableError` when their
patience runs out, naming the base URL, and `ApiAuthError` (a `PermissionError`) for a token the API
refuses; httpx's own errors leave them only for what the API never answers (an undocumented status, a base
URL httpx cannot use).

A name that is refused (a tool, a provider, a tier) is refused with the closest name that would have been
accepted, when one is close (`find_close_name`): the Python clients, the CLI and the HTTP API all say the
error's message, so each shows the same "did you mean …?".
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import redis

from workers.errors import (
    InvalidResultError,
    RedisConfigError,
    ToolDefinitionError,
    ToolloopError,
    ToolModuleError,
    TransientToolError,
)
from workers.redis_errors import classify

__all__ = [
    "ApiAuthError",
    "ApiKeysError",
    "ApiUnavailableError",
    "BenchError",
    "CallNotWaitingError",
    "DemoError",
    "EventStreamError",
    "InvalidResultError",
    "MalformedBody",
    "ModelConfigError",
    "OpsError",
    "PortUnavailableError",
    "RedisConfigError",
    "RedisServerError",
    "RedisUnavailableError",
    "StateVersionError",
    "ToolDefinitionError",
    "ToolModuleError",
    "ToolloopError",
    "TransientToolError",
    "UnknownAgentError",
    "UnknownToolError",
    "UnknownTurnError",
]


def find_close_name(name: str, known: Iterable[str]) -> str | None:
    """The name of `known` closest to `name` when one is close enough to be a slip of the keyboard (difflib's
    similarity of at least 0.6, as `get_close_matches` has it), else None."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return close[0] if close else None


def build_did_you_mean(name: str, known: Iterable[str]) -> str:
    """`" (did you mean 'add'?)"` after a refused `name` when a name of `known` is close to it, else ""."""
    close = find_close_name(name, known)
    return f" (did you mean {close!r}?)" if close is not None else ""


class ApiKeysError(ToolloopError, ValueError):
    """`TOOLLOOP_API_KEYS` cannot be used: not JSON, not an object of keys, or an entry that is not one key's
    tenant, scopes and tools (`api.access.parse_api_keys`). The message starts with the setting's name and
    never holds a key."""


class UnknownTurnError(ToolloopError, LookupError):
    """No turn with this id is stored (never submitted, or expired after `keys.TURN_TTL_S`)."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"unknown turn {turn_id!r}")
        self.turn_id = turn_id


class CallNotWaitingError(ToolloopError, LookupError):
    """An approval, a denial or a client-side tool's result for a call of a running turn that waits for none:
    no such call, not one that waits for that answer, or one answered already (`decided`: the first answer
    stands)."""

    def __init__(
        self, turn_id: str, call_id: str, *, decided: bool = False, waiting_for: str = "approval"
    ) -> None:
        # `waiting_for`: the answer refused, "approval" or "client_result" (a client-side tool's result).
        answer, settled = ("approval", "decided") if waiting_for == "approval" else ("a result", "answered")
        why = f"it was {settled} already" if decided else "no call with this id waits for one"
        super().__init__(f"call {call_id!r} of turn {turn_id!r} is not waiting for {answer}: {why}")
        self.turn_id = turn_id
        self.call_id = call_id
        self.decided = decided


class UnknownToolError(ToolloopError, ValueError):
    """A turn names tools that no live worker serves; nothing was stored.

    `unknown` are the names refused, in the order given; `available` the public tools of the catalogue
    (sorted): a sensitive tool the turn did not name is never listed, nor ever suggested for a misspelt one.
    """

    def __init__(self, unknown: Iterable[str], available: Iterable[str]) -> None:
        self.unknown = list(unknown)
        self.available = list(available)
        names = ", ".join(self._refused(name) for name in self.unknown)
        word = "tool" if len(self.unknown) == 1 else "tools"
        super().__init__(f"unknown {word} {names} in 'tools'; available: {self._listing()}")

    def describe(self, name: str) -> str:
        """The refusal of one of the `unknown` names alone: `unknown tool 'ad' (did you mean 'add'?);
        available: add, echo`."""
        return f"unknown tool {self._refused(name)}; available: {self._listing()}"

    def _refused(self, name: str) -> str:
        return repr(name) + build_did_you_mean(name, self.available)

    def _listing(self) -> str:
        return ", ".join(self.available) or "none"


class UnknownAgentError(ToolloopError, ValueError):
    """A turn names an agent that no worker declares and no client registered; nothing was stored.
    `available`: the agents known, sorted."""

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.name = name
        self.available = sorted(available)
        listing = ", ".join(self.available) or "none"
        super().__init__(
            f"unknown agent {name!r}{build_did_you_mean(name, self.available)}; available: {listing}"
        )


class StateVersionError(ToolloopError, ValueError):
    """A stored turn state has a version this code does not read."""

    def __init__(self, found: object, supported: Iterable[int]) -> None:
        versions = ", ".join(str(v) for v in sorted(supported))
        super().__init__(
            f"turn state version {found!r} is not supported (this code reads version {versions})"
        )
        self.found = found


class EventStreamError(ToolloopError, ValueError):
    """Bytes that are not AWS event-stream frames, or a stream cut inside a frame (`cut` is then True)."""

    def __init__(self, message: str, *, cut: bool = False) -> None:
        super().__init__(message)
        self.cut = cut


class MalformedBody(ToolloopError, ValueError):
    """A provider body that does not have the shape of its wire format; `where` says which field."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where


class ModelConfigError(ToolloopError, ValueError):
    """A model name, tier or provider this process cannot serve; the message names what is configured, and
    the closest known name to one refused (`build_did_you_mean`)."""


class RedisUnavailableError(ToolloopError, redis.exceptions.ConnectionError, TimeoutError):
    """Redis did not answer within a client's patience (a restart or a failover that outlasted it).

    A `redis.ConnectionError`, so code that reports an unreachable Redis keeps doing so, and a `TimeoutError`,
    since the caller's own time (a `wait` timeout) is what ran out. One line naming the URL, password hidden.
    """

    def __init__(self, where: str, waited_s: float, last: BaseException) -> None:
        reason = " ".join(str(last).split()) or type(last).__name__
        meaning = classify(last)
        # A Redis that answers but refuses (full, read-only, loading) is reached: said as a refusal.
        if meaning is not None and meaning.kind.refusal:
            said = f"Redis at {where} refused the request ({meaning.kind}; tried for {waited_s:.1f} s)"
        else:
            said = f"cannot reach Redis at {where} (tried for {waited_s:.1f} s)"
        super().__init__(f"{said}: {reason}")
        self.where = where
        self.waited_s = waited_s


class ApiUnavailableError(ToolloopError, TimeoutError):
    """The HTTP API did not answer within an HTTP client's patience: nothing listened at `base_url`, the
    connection dropped, or the API answered 502/503/504 (a proxy without a backend, the API without Redis)
    for all of it.

    A `TimeoutError`, as `RedisUnavailableError` is: the caller's time is what ran out. One line naming the
    base URL, how long the client tried and the last failure."""

    def __init__(self, base_url: str, waited_s: float, last: BaseException | str) -> None:
        reason = " ".join(str(last).split()) or type(last).__name__
        super().__init__(
            f"cannot reach the toolloop API at {base_url} (tried for {waited_s:.1f} s): {reason}"
        )
        self.base_url = base_url
        self.waited_s = waited_s


class ApiAuthError(ToolloopError, PermissionError):
    """The HTTP API refused the client's bearer token (401: none given, or not the API's
    `TOOLLOOP_API_TOKEN`; 403: not allowed). `status_code` is the API's answer, `detail` its reason."""

    def __init__(self, base_url: str, status_code: int, detail: str) -> None:
        super().__init__(
            f"the toolloop API at {base_url} refused the request ({status_code}: {detail}); give the client "
            "the API's token (its TOOLLOOP_API_TOKEN) as token="
        )
        self.base_url = base_url
        self.status_code = status_code
        self.detail = detail


class OpsError(ToolloopError, RuntimeError):
    """The local tooling (embedded Redis, demo, benchmarks) could not do its job."""


class RedisServerError(OpsError):
    """No redis-server binary, or it did not start answering PING in time."""


class PortUnavailableError(RedisServerError):
    """Our redis-server could not serve its port (exited at once, or another server answers there)."""


class DemoError(OpsError):
    """A part of the demo did not start or the turn did not finish; the message says which and why."""


class BenchError(OpsError):
    """A scenario could not produce its figure (a turn failed, a process died)."""
