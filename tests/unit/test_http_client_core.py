"""The HTTP clients' pure core, and both faces over `httpx.MockTransport` (no server, no Redis): how requests
are built, how answers are read and errors mapped into the tree, the SSE decoder (split chunks, comments,
multi-line data), and the retry policy (what is sent again, for how long, and `Last-Event-ID` resuming).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from orchestrator.client.direct import build_direct_call
from orchestrator.client.http_client import (
    CALL_MARGIN_S,
    REQUEST_TIMEOUT,
    ApiOutage,
    AsyncHttpClient,
    EventFollow,
    HttpClient,
    SseDecoder,
    SseMessage,
    build_approval_call,
    build_outcome_call,
    build_submit_call,
    build_tool_call,
    build_turn_path,
    build_view_call,
    is_api_away,
    raise_for_answer,
    read_control,
)
from orchestrator.errors import (
    ApiAuthError,
    ApiUnavailableError,
    CallNotWaitingError,
    ModelConfigError,
    UnknownToolError,
    UnknownTurnError,
)
from orchestrator.model import TurnRequest
from orchestrator.store.runner import Patience
from orchestrator.store.turn_stream import TextDeltaEvent, TurnFinishedEvent
from tests.support.fake_time import SleepingClock
from workers.contract import ToolOutcome

pytestmark = pytest.mark.timeout(10)

BASE = "http://api.test"
TURN = "turn_1"
REQUEST = {"prompt": "2+2?"}
OUTCOME = {"turn_id": TURN, "status": "completed", "text": "4"}
Handler = Callable[[httpx.Request], httpx.Response]


def answer(
    status: int, body: Any = None, *, method: str = "GET", path: str = "/v1/turns/x"
) -> httpx.Response:
    """An answer of the API to a request it was given (httpx's errors need the request)."""
    return httpx.Response(status, json=body, request=httpx.Request(method, BASE + path))


def view(*, outcome: dict[str, Any] | None = None, status: str = "running") -> dict[str, Any]:
    return {"id": TURN, "status": status, "request": REQUEST, "outcome": outcome}


def sse(event_id: str, name: str, data: dict[str, Any] | None = None) -> bytes:
    event = {"id": event_id, "name": name, "turn_id": TURN, "at": 1.0, "data": data or {}}
    return f"id: {event_id}\nevent: {name}\ndata: {json.dumps(event)}\n\n".encode()


def sync_client(handler: Handler, clock: SleepingClock, **kwargs: Any) -> HttpClient:
    return HttpClient(
        BASE,
        token="t0k",
        transport=httpx.MockTransport(handler),
        sleep=clock.sleep,
        clock=clock.now,
        **kwargs,
    )


# --- request builders ------------------------------------------------------------------------------------


def test_paths_percent_encode_each_segment_dots_too() -> None:
    assert build_turn_path("t 1", "approvals", "a/b") == "/v1/turns/t%201/approvals/a%2Fb"
    assert build_turn_path("..", "cancel") == "/v1/turns/%2E%2E/cancel"
    call = build_tool_call(build_direct_call("../x", {}))
    assert call.path == "/v1/tools/%2E%2E%2Fx/calls"


def test_a_submit_carries_its_id_and_its_trace_as_a_header_not_in_the_body() -> None:
    request = TurnRequest.model_validate({**REQUEST, "trace_context": {"traceparent": "00-ab-cd-01"}})
    call = build_submit_call(request, "my_id")
    assert (call.method, call.path) == ("POST", "/v1/turns")
    assert call.body["turn_id"] == "my_id" and "trace_context" not in call.body
    assert call.headers == {"traceparent": "00-ab-cd-01"} and call.resend
    assert call.read(answer(202, {"id": "my_id"}, method="POST")) == "my_id"


def test_an_approval_is_checked_before_it_is_sent_as_the_redis_clients_check_it() -> None:
    call = build_approval_call(TURN, "call_1", True, {"x": 1}, None)
    assert call.path == "/v1/turns/turn_1/approvals/call_1"
    assert call.body == {"approved": True, "arguments": {"x": 1}, "reason": None}
    with pytest.raises(ValueError, match="call_id must not be empty"):
        build_approval_call(TURN, "", True, None, None)
    with pytest.raises(ValueError, match="arguments"):  # what JSON cannot carry (codec's own check)
        build_approval_call(TURN, "call_1", True, {"x": float("nan")}, None)


def test_a_tool_call_is_held_open_for_its_timeout_and_never_sent_again_once_sent() -> None:
    call = build_tool_call(build_direct_call("add", {"a": 1, "b": float("nan")}, 12.5, {"k": "v"}))
    assert (call.method, call.path, call.resend, call.body) == ("POST", "/v1/tools/add/calls", False, None)
    assert call.content is not None
    # NaN goes as JSON's common extension: the API reads it and checks it as the Redis clients' call does.
    assert json.loads(call.content) == {
        "arguments": {"a": 1, "b": pytest.approx(float("nan"), nan_ok=True)},
        "timeout_s": 12.5,
        "context": {"k": "v"},
        "approve": False,
    }
    assert call.timeout is not None and call.timeout.read == 12.5 + CALL_MARGIN_S
    assert call.timeout.connect == REQUEST_TIMEOUT.connect
    traced = build_tool_call(build_direct_call("add", {}), {"traceparent": "00-ab-cd-01"})
    assert traced.headers == {"traceparent": "00-ab-cd-01", "Content-Type": "application/json"}
    forever = build_tool_call(build_direct_call("add", {}, float("inf")))
    assert forever.timeout is not None and forever.timeout.read is None  # the API refuses it (422)
    outcome = {"call_id": "c", "tool": "add", "ok": True, "result": 3, "content": "3"}
    assert call.read(answer(200, outcome, method="POST")) == ToolOutcome.model_validate(outcome)


# --- answer readers and the error mapping ----------------------------------------------------------------


def test_answers_map_into_the_error_tree() -> None:
    with pytest.raises(UnknownTurnError, match="turn_1"):
        raise_for_answer(answer(404, {"detail": "unknown turn"}), TURN)
    for status in (400, 413):
        with pytest.raises(ValueError, match="too big") as refused:
            raise_for_answer(answer(status, {"detail": "too big"}))
        assert type(refused.value) is ValueError
    for status in (401, 403):
        with pytest.raises(ApiAuthError, match="wrong bearer token") as denied:
            raise_for_answer(answer(status, {"detail": "missing or wrong bearer token"}))
        assert denied.value.status_code == status and isinstance(denied.value, PermissionError)
        assert f"GET {BASE}/v1/turns/x" in str(denied.value) and "token=" in str(denied.value)
    for status in (500, 418):  # what the API does not document stays httpx's
        with pytest.raises(httpx.HTTPStatusError) as undocumented:
            raise_for_answer(answer(status, {"detail": "?"}))
        assert not is_api_away(undocumented.value)
    with pytest.raises(httpx.HTTPStatusError) as away:
        raise_for_answer(answer(503, {"detail": "Redis unavailable"}))
    assert is_api_away(away.value)
    raise_for_answer(answer(200, {}))


def test_a_refused_submit_is_the_error_the_redis_clients_raise() -> None:
    unknown = {"type": "unknown_tool", "loc": ["body", "tools", 1], "msg": "unknown tool 'ad'"}
    detail = [{**unknown, "ctx": {"tool": "ad", "available": ["add", "echo"]}}]
    with pytest.raises(UnknownToolError) as tools:
        raise_for_answer(answer(422, {"detail": detail}))
    assert tools.value.unknown == ["ad"] and tools.value.available == ["add", "echo"]
    model = [{"type": "value_error", "loc": ["body", "model"], "msg": "unknown model 'x'"}]
    with pytest.raises(ModelConfigError, match="unknown model 'x'"):
        raise_for_answer(answer(422, {"detail": model}))
    fields = [
        {"type": "missing", "loc": ["body", "limits", "deadline_s"], "msg": "bad"},
        {"type": "value_error", "loc": ["body"], "msg": "needs a prompt"},
    ]
    with pytest.raises(ValueError, match=r"^limits\.deadline_s: bad; needs a prompt$"):
        raise_for_answer(answer(422, {"detail": fields}))


def test_a_409_is_false_or_call_not_waiting_as_from_the_redis_clients() -> None:
    assert read_control(answer(409, {"detail": "ended", "code": "turn_ended"}), TURN) is False
    assert read_control(answer(202, {"id": TURN, "accepted": True}), TURN) is True
    for code, decided in (("call_not_waiting", False), ("call_decided", True)):
        with pytest.raises(CallNotWaitingError) as refused:
            read_control(answer(409, {"detail": "no", "code": code}), TURN, "call_1")
        assert (refused.value.turn_id, refused.value.call_id, refused.value.decided) == (
            TURN,
            "call_1",
            decided,
        )


def test_an_outcome_is_none_while_the_turn_runs_and_for_an_unknown_turn() -> None:
    read = build_outcome_call(TURN).read
    assert read(answer(404, {"detail": "unknown turn"})) is None  # as `Client.outcome`
    assert read(answer(200, view())) is None
    done = read(answer(200, view(outcome=OUTCOME, status="completed")))
    assert done is not None and done.text == "4"
    with pytest.raises(UnknownTurnError):  # `get` keeps its 404
        build_view_call(TURN).read(answer(404, {"detail": "unknown turn"}))


# --- the SSE decoder -------------------------------------------------------------------------------------


def feed_all(decoder: SseDecoder, lines: list[str]) -> list[SseMessage]:
    return [message for line in lines if (message := decoder.feed(line)) is not None]


def test_the_decoder_joins_data_lines_skips_comments_and_dispatches_at_a_blank_line() -> None:
    lines = [
        ": keep-alive",
        "",  # a blank line after a comment alone dispatches nothing
        "id: 7-0",
        "event: text_delta",
        "data: first",
        ": a comment between data lines",
        "data:second",  # no space after the colon
        "data",  # a field name alone: an empty value
        "retry: 1000",  # a field the API never sends: ignored
        "",
        "data: plain",
        "",
        "id: bad\0id",  # an id with NUL is ignored, as the standard says
        "data: x",
        "",
    ]
    assert feed_all(SseDecoder(), lines) == [
        SseMessage("text_delta", "first\nsecond\n", "7-0"),
        SseMessage("message", "plain", None),
        SseMessage("message", "x", None),
    ]


def test_a_stream_split_anywhere_reads_the_same(clock: SleepingClock) -> None:
    body = b": keep-alive\r\n\r\n" + sse("1-0", "turn_started") + sse("2-0", "turn_finished")
    for size in (1, 2, 3, 7, 64):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]

        def handler(request: httpx.Request, chunks: list[bytes] = chunks) -> httpx.Response:
            return httpx.Response(200, content=iter(chunks), headers={"content-type": "text/event-stream"})

        with sync_client(handler, clock) as client:
            assert [(e.id, e.name) for e in client.events(TURN)] == [
                ("1-0", "turn_started"),
                ("2-0", "turn_finished"),
            ], size


def test_the_follower_moves_its_cursor_and_resumes_after_it() -> None:
    follow = EventFollow(TURN, "0")
    assert follow.reconnect() == {"Accept": "text/event-stream", "Last-Event-ID": "0"}
    lines = sse("3-1", "turn_started").decode().split("\n")
    events = [event for line in lines if (event := follow.feed(line)) is not None]
    assert [e.id for e in events] == ["3-1"] and follow.cursor == "3-1" and not follow.finished
    follow.decoder.feed("data: half a message")
    assert follow.reconnect()["Last-Event-ID"] == "3-1"
    assert follow.decoder == SseDecoder()  # what a dropped connection left half read is dropped with it


# --- the retry policy ------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> SleepingClock:
    return SleepingClock()


def test_the_patience_runs_out_as_api_unavailable_error_naming_the_base_url(clock: SleepingClock) -> None:
    outage = ApiOutage(Patience.for_s(1.0, clock.now), BASE)
    refused = httpx.ConnectError("connection refused")
    with pytest.raises(ApiUnavailableError) as away:
        while True:
            clock.sleep(outage.failed(refused))
    assert isinstance(away.value, TimeoutError) and away.value.__cause__ is refused
    assert str(away.value) == f"cannot reach the toolloop API at {BASE} (tried for 1.0 s): connection refused"
    assert clock.pauses[0] < clock.pauses[1] and sum(clock.pauses) == pytest.approx(1.0)


def test_what_is_retried_and_what_is_raised_at_once(clock: SleepingClock) -> None:
    outage = ApiOutage(Patience.for_s(None, clock.now), BASE)
    for away in (httpx.ConnectError("x"), httpx.ReadError("x"), answer_error(503), answer_error(502)):
        assert outage.failed(away) > 0
    for own in (answer_error(500), answer_error(404), ValueError("bad")):
        with pytest.raises(type(own)):
            outage.failed(own)
    # A call that may have reached the API is not sent again: only a refused connection is.
    assert outage.failed(httpx.ConnectError("x"), resend=False) > 0
    for maybe_sent in (httpx.ReadError("x"), answer_error(503)):
        with pytest.raises(ApiUnavailableError):
            outage.failed(maybe_sent, resend=False)


def test_a_quiet_stream_at_the_callers_deadline_is_a_timeout_not_an_absent_api(clock: SleepingClock) -> None:
    outage = ApiOutage(Patience.for_s(1.0, clock.now), BASE)
    clock.sleep(1.0)
    with pytest.raises(TimeoutError) as quiet:
        outage.failed(httpx.ReadTimeout("quiet"), streaming=True)
    assert not isinstance(quiet.value, ApiUnavailableError)


def answer_error(status: int) -> httpx.HTTPStatusError:
    reply = answer(status, {"detail": "x"})
    return httpx.HTTPStatusError(str(status), request=reply.request, response=reply)


def test_a_call_rides_out_503s_and_refused_connections(clock: SleepingClock) -> None:
    tries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tries.append(request.headers["Authorization"])
        if len(tries) == 1:
            raise httpx.ConnectError("refused", request=request)
        if len(tries) == 2:
            return httpx.Response(503, json={"detail": "Redis unavailable"}, headers={"Retry-After": "1"})
        return httpx.Response(202, json={"id": TURN, "accepted": True})

    with sync_client(handler, clock) as client:
        assert client.cancel(TURN) is True
    assert tries == ["Bearer t0k"] * 3 and len(clock.pauses) == 2


def test_a_ping_is_true_or_api_unavailable_error_at_once_as_the_redis_clients_ping(
    clock: SleepingClock,
) -> None:
    answers = iter([httpx.Response(200, json={"status": "ok", "redis": "ok"}), httpx.Response(503, json={})])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/healthz"
        return next(answers)

    with sync_client(handler, clock) as client:
        assert client.ping() is True
        with pytest.raises(ApiUnavailableError, match="503"):  # the API without its Redis
            client.ping()
    assert clock.pauses == []


def test_a_tool_call_is_not_sent_again_once_it_may_have_run(clock: SleepingClock) -> None:
    tries: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        if len(tries) == 1:
            raise httpx.ConnectError("refused", request=request)  # never reached the API: sent again
        raise httpx.ReadError("connection reset", request=request)  # it may have run: raised

    with sync_client(handler, clock) as client, pytest.raises(ApiUnavailableError, match="connection reset"):
        client.call_tool("add", {"a": 1, "b": 2}, timeout_s=5)
    assert len(tries) == 2 and tries[0].extensions["timeout"]["read"] == 5 + CALL_MARGIN_S


def test_an_events_stream_resumes_after_the_last_event_with_last_event_id(clock: SleepingClock) -> None:
    sent_ids: list[str | None] = []

    def dropped_after_two() -> Iterator[bytes]:
        yield sse("1-0", "turn_started") + sse("2-0", "text_delta", {"llm_call": 0, "text": "Hel"})
        yield sse("3-0", "text_delta", {"llm_call": 0, "text": "lo"})[
            :20
        ]  # cut mid-message: it is sent again in full
        raise httpx.RemoteProtocolError("peer closed connection")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            sent_ids.append(request.headers.get("Last-Event-ID"))
            if len(sent_ids) == 1:
                return httpx.Response(200, content=dropped_after_two())
            if len(sent_ids) == 2:
                return httpx.Response(503, json={"detail": "restarting"})
            return httpx.Response(
                200,
                content=sse("3-0", "text_delta", {"llm_call": 0, "text": "lo"}) + sse("4-0", "turn_finished"),
            )
        return httpx.Response(200, json=view(outcome=OUTCOME, status="completed"))

    with sync_client(handler, clock) as client:
        stream = list(client.stream(TURN))
    assert sent_ids == ["0", "2-0", "2-0"]
    assert [e.id for e in stream] == ["1-0", "2-0", "3-0", "4-0"]
    assert "".join(e.text for e in stream if isinstance(e, TextDeltaEvent)) == "Hello"
    assert isinstance(stream[-1], TurnFinishedEvent) and stream[-1].outcome.text == "4"


def test_a_wait_with_the_api_away_all_along_is_api_unavailable_error(clock: SleepingClock) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with sync_client(handler, clock) as client, pytest.raises(ApiUnavailableError, match=BASE):
        client.wait(TURN, timeout=3.0)
    assert sum(clock.pauses) == pytest.approx(3.0)


def test_a_wait_on_a_quiet_turn_is_a_timeout_naming_the_turn(clock: SleepingClock) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            clock.sleep(5.0)  # the read waited until the caller's deadline
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json=view())

    with sync_client(handler, clock) as client, pytest.raises(TimeoutError, match="turn_1") as late:
        client.wait(TURN, timeout=2.0)
    assert not isinstance(late.value, ApiUnavailableError)


# --- the async face --------------------------------------------------------------------------------------


async def test_the_async_face_reads_split_chunks_resumes_and_maps_errors(clock: SleepingClock) -> None:
    sent_ids: list[str | None] = []

    async def dropped(body: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(body), 5):
            yield body[i : i + 5]
        raise httpx.ReadError("reset")

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/events"):
            sent_ids.append(request.headers.get("Last-Event-ID"))
            if len(sent_ids) == 1:
                return httpx.Response(200, content=dropped(b": hi\n\n" + sse("1-0", "turn_started")))
            return httpx.Response(200, content=sse("2-0", "turn_finished"))
        if path == "/v1/turns/nope":
            return httpx.Response(404, json={"detail": "unknown turn 'nope'"})
        if path.startswith("/v1/tools/"):
            return httpx.Response(401, json={"detail": "missing or wrong bearer token"})
        return httpx.Response(200, json=view(outcome=OUTCOME, status="completed"))

    transport = httpx.MockTransport(handler)
    async with AsyncHttpClient(BASE, transport=transport, sleep=clock.asleep, clock=clock.now) as client:
        assert [e.id async for e in client.events(TURN)] == ["1-0", "2-0"]
        assert await client.outcome("nope") is None
        with pytest.raises(UnknownTurnError):
            await client.get("nope")
        with pytest.raises(ApiAuthError):
            await client.call_tool("add", {"a": 1, "b": 2})
        outcome = await client.wait(TURN, timeout=1.0)
    assert sent_ids == ["0", "1-0"] and outcome.text == "4"
