"""A local stand-in for Gemini, Bedrock and Cohere, speaking each one's own wire format at its real paths, in
a thread of the test process (as `e2e_model.RecordingModelServer` serves the scripted model).

    with WireModelServer(calls=[PlannedCall("e2e_add", {"a": 2, "b": 3}), ...]) as server:
        env = server.provider_env()          # GEMINI_BASE_URL, COHERE_BASE_URL, AWS_* for the orchestrator
        ... a turn naming gemini:…, bedrock:… or cohere:… ...
        server.requests(marker=marker)       # what reached each provider: path, headers, parsed body

Paths, as the providers serve them:

    POST /v1beta/models/{model}:generateContent            Gemini, one JSON body
    POST /v1beta/models/{model}:streamGenerateContent?alt=sse   Gemini, SSE (each event a whole response)
    POST /model/{model id, percent-encoded}/converse         Bedrock Converse, one JSON body
    POST /model/{model id, percent-encoded}/converse-stream  Bedrock ConverseStream, AWS event-stream frames
    POST /v2/chat                                            Cohere v2 Chat (`"stream": true`: SSE)

Every answer is a recorded real body or stream of ../shared/provider_responses, its shape kept and the test's
tool calls and text put in: a request whose conversation holds no tool result yet is answered with two
parallel calls of `calls` (Gemini's first call keeps the recorded `thoughtSignature`; Bedrock's answer keeps
its signed reasoning block; Cohere's its tool plan), and a request that carries results (in the provider's
own shape, or as the text toolloop writes another provider's results in) with a final answer whose text
quotes every result of its last round (`FINAL_PREFIX` …), so a test can prove the results reached the
model. Streams are written a piece at a time, `chunk_delay_s` apart.

The credentials are checked as the providers do: Gemini's `x-goog-api-key` and Cohere's bearer key against
`API_KEY`; Bedrock's SigV4 `Authorization` is recomputed with botocore's signer from `ACCESS_KEY_ID` /
`SECRET_ACCESS_KEY` over the exact request that arrived (method, raw path, the headers it names as signed, the
body's bytes) and a request that is unsigned or signed otherwise gets Bedrock's 403. `overloaded(provider)`
makes one provider answer its overload error (Gemini 503 UNAVAILABLE, Bedrock 503
ServiceUnavailableException, Cohere 503 or 429) from a chosen tool round on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hmac
import json
import re
import socket
import struct
import threading
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import unquote

import uvicorn
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import find_shared_dir
from tests.support.waiting import wait_until

Provider = Literal["gemini", "bedrock", "cohere"]

API_KEY = "wire-test-key"
ACCESS_KEY_ID = "AKIAWIRETESTKEY00001"
SECRET_ACCESS_KEY = "wire/test/secret/key/0000000000000000000"
REGION = "us-east-1"
# Bedrock's runtime API signs as `bedrock` (its endpoints are `bedrock-runtime.*`).
SIGNING_SERVICE = "bedrock"
FINAL_PREFIX = "The tools answered:"
# How toolloop writes a result of another provider's call for a model of a different wire family.
FLATTENED_RESULT = "[Tool result: "
TOOL_PLAN = "I will call {names} at once."
THOUGHT = "Both results are in; I can answer now."
GEMINI_UNAVAILABLE = "The model is overloaded. Please try again later."
BEDROCK_UNAVAILABLE = "Bedrock is unable to process your request."
COHERE_OVERLOADED = {503: "service unavailable, please try again later", 429: "too many requests"}
# Bedrock's answers to an unsigned request, an unknown key and a signature that does not verify.
MISSING_TOKEN = ("MissingAuthenticationTokenException", "Missing Authentication Token")
UNKNOWN_KEY = ("UnrecognizedClientException", "The security token included in the request is invalid.")
BAD_SIGNATURE = (
    "InvalidSignatureException",
    "The request signature we calculated does not match the signature you provided. Check your AWS Secret "
    "Access Key and signing method. Consult the service documentation for details.",
)
EVENT_STREAM_TYPE = "application/vnd.amazon.eventstream"
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)"
    r"/aws4_request, ?SignedHeaders=(?P<signed>[^,]+), ?Signature=(?P<signature>[0-9a-f]{64})$"
)
# The recorded bodies each answer is built on (../shared/provider_responses).
GEMINI_CALLS = "gemini__parallel_function_calls_thought_signature.json"
GEMINI_STREAM = "gemini__stream_function_call_then_empty_text.sse"
GEMINI_FINAL = "gemini__final_answer_with_thought_part.json"
BEDROCK_CALLS = "bedrock_converse__reasoning_text_and_tool_use.json"
COHERE_CALLS = "cohere_v2__tool_plan_and_null_arguments.json"
# A real stream cuts text into a few words per event.
_PIECE_CHARS = 12


@dataclass(frozen=True)
class PlannedCall:
    """A tool call the model asks for in its first round: a tool the test's worker serves, and arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Received:
    """One request as it arrived: the provider it was for, the model, the raw path (percent-encoding kept)
    and query, its headers (names lower-cased), its parsed body, the tool round it was in (how many rounds
    of results it carried), whether it asked for a stream, and the status it was answered with."""

    provider: Provider
    model: str
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]
    round: int
    streamed: bool
    status: int

    def mentions(self, marker: str) -> bool:
        """True when the body holds `marker` (a string unique to one test's prompt)."""
        return marker in json.dumps(self.body, ensure_ascii=False)


@dataclass(frozen=True)
class _Overload:
    provider: Provider
    from_round: int
    status: int


class WireModelServer:
    """`with WireModelServer(calls=...) as server:` — Gemini, Bedrock and Cohere at `server.base_url`."""

    def __init__(
        self,
        calls: Sequence[PlannedCall],
        *,
        responses_dir: Path | None = None,
        chunk_delay_s: float = 0.0,
        secret_access_key: str = SECRET_ACCESS_KEY,
    ) -> None:
        if len(calls) < 2:
            raise ValueError("the model asks for parallel calls: plan at least two")
        self.calls = list(calls)
        self.chunk_delay_s = chunk_delay_s
        self.secret_access_key = secret_access_key
        self.recorded = _Recorded(responses_dir or find_shared_dir() / "provider_responses")
        self._received: list[Received] = []
        self._overloads: list[_Overload] = []
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(self.build_app(), lifespan="off", log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        # Not the main thread: uvicorn leaves the test process's signal handlers alone.
        self._thread = threading.Thread(target=self._serve, name="wire-models", daemon=True)

    # --- lifecycle --------------------------------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def __enter__(self) -> Self:
        self._thread.start()
        wait_until(
            lambda: self._server.started or not self._thread.is_alive(), "the wire model server to start", 10
        )
        if not self._server.started:
            raise RuntimeError("the wire model server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def provider_env(self, *, secret_access_key: str = SECRET_ACCESS_KEY) -> dict[str, str]:
        """The environment of an orchestrator calling this server as all three providers: the base URLs,
        the keys, the region and AWS credentials (`secret_access_key` to sign with; the server expects
        `SECRET_ACCESS_KEY`), and no AWS file or metadata endpoint that could answer instead."""
        return {
            "GEMINI_BASE_URL": self.base_url,
            "GEMINI_API_KEY": API_KEY,
            "COHERE_BASE_URL": self.base_url,
            "COHERE_API_KEY": API_KEY,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": self.base_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": secret_access_key,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    # --- what the tests read and switch -----------------------------------------------------------------

    def requests(self, *, marker: str | None = None, provider: Provider | None = None) -> list[Received]:
        """Every request received so far, in order; only those holding `marker`, or for `provider`."""
        with self._lock:
            received = list(self._received)
        return [
            r
            for r in received
            if (marker is None or r.mentions(marker)) and (provider is None or r.provider == provider)
        ]

    @contextlib.contextmanager
    def overloaded(self, provider: Provider, *, from_round: int = 0, status: int = 503) -> Iterator[None]:
        """While open, `provider` answers its overload error to every request of tool round `from_round` or
        later (0: every request; 1: once results came back). `status` is Cohere's 503 or 429; Gemini and
        Bedrock answer 503."""
        rule = _Overload(provider, from_round, status)
        with self._lock:
            self._overloads.append(rule)
        try:
            yield
        finally:
            with self._lock:
                self._overloads.remove(rule)

    def _overload_status(self, provider: Provider, round_number: int) -> int | None:
        with self._lock:
            rules = [o for o in self._overloads if o.provider == provider and round_number >= o.from_round]
        return rules[-1].status if rules else None

    def _keep(self, received: Received) -> None:
        with self._lock:
            self._received.append(received)

    # --- the app ----------------------------------------------------------------------------------------

    def build_app(self) -> Starlette:
        """The ASGI app: one route per provider endpoint."""
        return Starlette(
            routes=[
                Route("/v1beta/models/{target:path}", self._gemini, methods=["POST"]),
                Route("/model/{model_id:path}/converse-stream", self._bedrock, methods=["POST"]),
                Route("/model/{model_id:path}/converse", self._bedrock, methods=["POST"]),
                Route("/v2/chat", self._cohere, methods=["POST"]),
            ]
        )

    async def _read(self, request: Request) -> tuple[bytes, dict[str, Any], str, str]:
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        path = bytes(request.scope["raw_path"]).decode("ascii")
        query = bytes(request.scope["query_string"]).decode("ascii")
        return raw, body if isinstance(body, dict) else {"not_an_object": body}, path, query

    def _record(
        self,
        provider: Provider,
        request: Request,
        parsed: tuple[bytes, dict[str, Any], str, str],
        *,
        model: str,
        round_number: int,
        streamed: bool,
        status: int,
    ) -> None:
        _, body, path, query = parsed
        self._keep(
            Received(
                provider=provider,
                model=model,
                path=path,
                query=query,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                round=round_number,
                streamed=streamed,
                status=status,
            )
        )

    # --- Gemini -----------------------------------------------------------------------------------------

    async def _gemini(self, request: Request) -> Response:
        parsed = await self._read(request)
        _, body, _, _ = parsed
        model, _, method = str(request.path_params["target"]).partition(":")
        streamed = method == "streamGenerateContent" and request.query_params.get("alt") == "sse"
        results = read_gemini_results(body)
        round_number = len(results)
        status = 200
        response: Response
        if request.headers.get("x-goog-api-key") != API_KEY:
            status = 400
            response = gemini_error(
                400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT"
            )
        elif method not in ("generateContent", "streamGenerateContent"):
            status = 404
            response = gemini_error(404, f"method {method!r} not found", "NOT_FOUND")
        elif (overload := self._overload_status("gemini", round_number)) is not None:
            status = overload
            response = gemini_error(503, GEMINI_UNAVAILABLE, "UNAVAILABLE")
        else:
            chunks = self.build_gemini_chunks(model, results)
            if streamed:
                frames = [f"data: {json.dumps(chunk)}\r\n\r\n".encode() for chunk in chunks]
                response = self._streaming(frames, "text/event-stream")
            else:
                response = JSONResponse(merge_gemini_chunks(chunks))
        self._record(
            "gemini",
            request,
            parsed,
            model=model,
            round_number=round_number,
            streamed=streamed,
            status=status,
        )
        return response

    def build_gemini_chunks(self, model: str, results: list[list[str]]) -> list[dict[str, Any]]:
        """The answer as the chunks of a stream (a whole body merges them): the calls, one chunk each, then
        the recorded closing chunk; or the final answer's text a few words a chunk, the last one finishing."""
        if not results:
            recorded_parts = self.recorded.json(GEMINI_CALLS)["candidates"][0]["content"]["parts"]
            template, closing = self.recorded.sse(GEMINI_STREAM)
            chunks = []
            for index, call in enumerate(self.calls):
                part: dict[str, Any] = {"functionCall": {"name": call.name, "args": call.arguments}}
                if index < len(recorded_parts) and "thoughtSignature" in recorded_parts[index]:
                    part["thoughtSignature"] = recorded_parts[index]["thoughtSignature"]
                chunk = copy.deepcopy(template)
                chunk["candidates"][0]["content"]["parts"] = [part]
                chunks.append(chunk)
            chunks.append(copy.deepcopy(closing))
        else:
            final = self.recorded.json(GEMINI_FINAL)
            thought, _ = final["candidates"][0]["content"]["parts"]
            pieces = [{**thought, "text": THOUGHT}] + [
                {"text": piece} for piece in split_text(build_final_text(results))
            ]
            chunks = []
            for part in pieces:
                chunk = copy.deepcopy(final)
                chunk["candidates"][0]["content"]["parts"] = [part]
                del chunk["candidates"][0]["finishReason"]
                chunks.append(chunk)
            chunks[-1]["candidates"][0]["finishReason"] = "STOP"
        response_id = uuid.uuid4().hex[:22]
        for chunk in chunks:
            chunk.update(modelVersion=model, responseId=response_id)
        return chunks

    # --- Bedrock ----------------------------------------------------------------------------------------

    async def _bedrock(self, request: Request) -> Response:
        parsed = await self._read(request)
        raw, body, path, query = parsed
        model = unquote(str(request.path_params["model_id"]))
        streamed = path.endswith("/converse-stream")
        results = read_bedrock_results(body)
        round_number = len(results)
        status = 200
        response: Response
        url = f"http://{request.headers.get('host', '')}{path}" + (f"?{query}" if query else "")
        refusal = self.check_signature(request.method, url, request.headers, raw)
        if refusal is not None:
            status = 403
            response = bedrock_error(403, *refusal)
        elif (overload := self._overload_status("bedrock", round_number)) is not None:
            status = overload
            response = bedrock_error(503, "ServiceUnavailableException", BEDROCK_UNAVAILABLE)
        else:
            answer = self.build_bedrock_answer(results)
            if streamed:
                response = self._streaming(build_converse_frames(answer), EVENT_STREAM_TYPE)
            else:
                response = JSONResponse(answer, headers={"x-amzn-requestid": str(uuid.uuid4())})
        self._record(
            "bedrock",
            request,
            parsed,
            model=model,
            round_number=round_number,
            streamed=streamed,
            status=status,
        )
        return response

    def check_signature(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[str, str] | None:
        """None when `Authorization` is a SigV4 signature of exactly this request (the headers it names as
        signed, the body's bytes) by the test credentials, for this region and Bedrock; else the exception
        name and message Bedrock answers with."""
        authorization = headers.get("authorization")
        amz_date = headers.get("x-amz-date")
        if not authorization or not amz_date:
            return MISSING_TOKEN
        found = _AUTHORIZATION.match(authorization)
        if found is None:
            return BAD_SIGNATURE
        if found["key"] != ACCESS_KEY_ID:
            return UNKNOWN_KEY
        if (found["region"], found["service"], found["date"]) != (REGION, SIGNING_SERVICE, amz_date[:8]):
            return BAD_SIGNATURE
        signed = found["signed"].split(";")
        if "host" not in signed or any(name not in headers for name in signed):
            return BAD_SIGNATURE
        aws_request = AWSRequest(
            method=method, url=url, data=body, headers={name: headers[name] for name in signed}
        )
        # The signer signs at the moment it is given; the client's moment is the request's X-Amz-Date.
        aws_request.context["timestamp"] = amz_date
        signer = SigV4Auth(Credentials(ACCESS_KEY_ID, self.secret_access_key), SIGNING_SERVICE, REGION)
        canonical = signer.canonical_request(aws_request)
        if signer.signed_headers(signer.headers_to_sign(aws_request)) != found["signed"]:
            return BAD_SIGNATURE
        expected = signer.signature(signer.string_to_sign(aws_request, canonical), aws_request)
        return None if hmac.compare_digest(expected, found["signature"]) else BAD_SIGNATURE

    def build_bedrock_answer(self, results: list[list[str]]) -> dict[str, Any]:
        """The recorded Converse body: its signed reasoning, its text, then a toolUse block per planned call
        (stopReason tool_use); with results, one text block, the final answer (stopReason end_turn)."""
        answer = self.recorded.json(BEDROCK_CALLS)
        content = answer["output"]["message"]["content"]
        if not results:
            kept = [block for block in content if "toolUse" not in block]
            answer["output"]["message"]["content"] = kept + [
                {
                    "toolUse": {
                        "toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}",
                        "name": call.name,
                        "input": call.arguments,
                    }
                }
                for call in self.calls
            ]
        else:
            answer["output"]["message"]["content"] = [{"text": build_final_text(results)}]
            answer["stopReason"] = "end_turn"
        return answer

    # --- Cohere -----------------------------------------------------------------------------------------

    async def _cohere(self, request: Request) -> Response:
        parsed = await self._read(request)
        _, body, _, _ = parsed
        streamed = body.get("stream") is True
        results = read_cohere_results(body)
        round_number = len(results)
        status = 200
        response: Response
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            status = 401
            response = JSONResponse({"id": str(uuid.uuid4()), "message": "invalid api token"}, 401)
        elif (overload := self._overload_status("cohere", round_number)) is not None:
            status = overload
            message = COHERE_OVERLOADED.get(overload, "service unavailable")
            response = JSONResponse({"id": str(uuid.uuid4()), "message": message}, overload)
        else:
            answer = self.build_cohere_answer(results)
            if streamed:
                response = self._streaming(build_cohere_events(answer), "text/event-stream")
            else:
                response = JSONResponse(answer)
        model = str(body.get("model") or "")
        self._record(
            "cohere",
            request,
            parsed,
            model=model,
            round_number=round_number,
            streamed=streamed,
            status=status,
        )
        return response

    def build_cohere_answer(self, results: list[list[str]]) -> dict[str, Any]:
        """The recorded v2 Chat body: a tool plan and a call per planned call (finish_reason TOOL_CALL), with
        the ids Cohere gives (`{name}_{12 characters}`); with results, the final answer's text block."""
        answer = self.recorded.json(COHERE_CALLS)
        answer["id"] = str(uuid.uuid4())
        message = answer["message"]
        if not results:
            message["tool_plan"] = TOOL_PLAN.format(names=" and ".join(c.name for c in self.calls))
            template = message["tool_calls"][0]
            calls = []
            for call in self.calls:
                wire = copy.deepcopy(template)
                wire["id"] = f"{call.name}_{uuid.uuid4().hex[:12]}"
                wire["function"] = {"name": call.name, "arguments": json.dumps(call.arguments)}
                calls.append(wire)
            message["tool_calls"] = calls
        else:
            answer["message"] = {
                "role": "assistant",
                "content": [{"type": "text", "text": build_final_text(results)}],
            }
            answer["finish_reason"] = "COMPLETE"
        return answer

    # --- streaming --------------------------------------------------------------------------------------

    def _streaming(self, frames: list[bytes], media_type: str) -> StreamingResponse:
        delay_s = self.chunk_delay_s

        async def write() -> AsyncIterator[bytes]:
            for index, frame in enumerate(frames):
                if index and delay_s:
                    await asyncio.sleep(delay_s)
                yield frame

        return StreamingResponse(write(), media_type=media_type)


# --- the recorded bodies --------------------------------------------------------------------------------


class _Recorded:
    """The recorded bodies, read once, copied for each answer."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._json: dict[str, dict[str, Any]] = {}

    def json(self, name: str) -> dict[str, Any]:
        if name not in self._json:
            self._json[name] = json.loads((self.directory / name).read_text("utf-8"))
        return copy.deepcopy(self._json[name])

    def sse(self, name: str) -> list[dict[str, Any]]:
        """The JSON of each `data:` line of a recorded SSE stream."""
        text = (self.directory / name).read_text("utf-8")
        return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


# --- reading requests -----------------------------------------------------------------------------------


def read_gemini_results(body: Mapping[str, Any]) -> list[list[str]]:
    """The tool results a `generateContent` body carries, one list per round (a user content holding
    `functionResponse` parts), each result's `output` (or `error`) as text."""
    rounds = []
    for content in body.get("contents") or []:
        parts = content.get("parts") or []
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        if content.get("role") == "user" and responses:
            rounds.append([_text(r.get("response", {}).get("output", r.get("response"))) for r in responses])
        flattened = [found for p in parts if (found := read_flattened_result(p.get("text"))) is not None]
        if content.get("role") == "model" and flattened:
            rounds.append(flattened)
    return rounds


def read_bedrock_results(body: Mapping[str, Any]) -> list[list[str]]:
    """The tool results a Converse body carries, one list per round (a user message of `toolResult`
    blocks), each result's text blocks joined."""
    rounds = []
    for message in body.get("messages") or []:
        blocks = message.get("content") or []
        found = [b["toolResult"] for b in blocks if "toolResult" in b]
        if message.get("role") == "user" and found:
            rounds.append(["".join(c.get("text", "") for c in r.get("content") or []) for r in found])
        flattened = [text for b in blocks if (text := read_flattened_result(b.get("text"))) is not None]
        if message.get("role") == "assistant" and flattened:
            rounds.append(flattened)
    return rounds


def read_cohere_results(body: Mapping[str, Any]) -> list[list[str]]:
    """The tool results a v2 Chat body carries, one list per round (a run of `tool` messages), each
    message's text blocks joined."""
    rounds: list[list[str]] = []
    previous = None
    for message in body.get("messages") or []:
        content = message.get("content")
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content or [])
        # A result of another provider's call, as text, counts as a result of its own kind.
        kind = message.get("role")
        flattened = read_flattened_result(text) if kind == "assistant" else None
        if flattened is not None:
            kind, text = "flattened", flattened
        if kind in ("tool", "flattened"):
            if previous != kind:
                rounds.append([])
            rounds[-1].append(text)
        previous = kind
    return rounds


def read_flattened_result(text: object) -> str | None:
    """The result a text states as toolloop writes another provider's results for a model of a different
    wire family (`[Tool result: name] content`, `machine.view`); None for any other text. A model reads it
    as a result like any other, and so does this server."""
    if not isinstance(text, str) or not text.startswith(FLATTENED_RESULT):
        return None
    return text.partition("] ")[2]


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def build_final_text(results: list[list[str]]) -> str:
    """The final answer's text: every result of the last round, quoted."""
    return f"{FINAL_PREFIX} " + "; ".join(results[-1]) + "."


def split_text(text: str) -> list[str]:
    """`text` in the few-word pieces a stream writes."""
    return [text[i : i + _PIECE_CHARS] for i in range(0, len(text), _PIECE_CHARS)] or [""]


# --- writing answers ------------------------------------------------------------------------------------


def gemini_error(code: int, message: str, status: str) -> JSONResponse:
    """Gemini's error envelope (google.rpc.Status)."""
    return JSONResponse({"error": {"code": code, "message": message, "status": status}}, code)


def bedrock_error(status: int, exception: str, message: str) -> JSONResponse:
    """Bedrock's error: `{"message"}`, the exception's name in `x-amzn-ErrorType` as AWS writes it."""
    headers = {
        "x-amzn-ErrorType": f"{exception}:http://internal.amazon.com/coral/com.amazon.coral.service/",
        "x-amzn-requestid": str(uuid.uuid4()),
    }
    return JSONResponse({"message": message}, status, headers=headers)


def merge_gemini_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The one `generateContent` body a stream's chunks add up to: every chunk's parts, text fragments of
    one kind joined, and the last chunk's finish reason and usage."""
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            joinable = parts and "text" in part and "text" in parts[-1]
            if joinable and bool(part.get("thought")) == bool(parts[-1].get("thought")):
                parts[-1] = {**parts[-1], "text": parts[-1]["text"] + part["text"]}
            elif part.get("text") != "" or len(part) > 1:
                parts.append(dict(part))
    body = copy.deepcopy(chunks[-1])
    body["candidates"][0]["content"]["parts"] = parts
    return body


def build_converse_frames(answer: Mapping[str, Any]) -> list[bytes]:
    """A Converse answer as the ConverseStream frames Bedrock writes: messageStart; per content block its
    start (toolUse), deltas (text a few words at a time, reasoning text then its signature, the tool's
    input as JSON text) and stop; messageStop; metadata with the usage."""
    frames = [build_event_frame("messageStart", {"role": "assistant"})]
    for index, block in enumerate(answer["output"]["message"]["content"]):
        deltas: list[dict[str, Any]] = []
        if "toolUse" in block:
            tool_use = block["toolUse"]
            start = {"toolUse": {"toolUseId": tool_use["toolUseId"], "name": tool_use["name"]}}
            frames.append(
                build_event_frame("contentBlockStart", {"contentBlockIndex": index, "start": start})
            )
            deltas.append({"toolUse": {"input": json.dumps(tool_use["input"])}})
        elif "reasoningContent" in block:
            reasoning = block["reasoningContent"]["reasoningText"]
            deltas += [{"reasoningContent": {"text": piece}} for piece in split_text(reasoning["text"])]
            if reasoning.get("signature"):
                deltas.append({"reasoningContent": {"signature": reasoning["signature"]}})
        else:
            deltas += [{"text": piece} for piece in split_text(block["text"])]
        frames += [
            build_event_frame("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})
            for delta in deltas
        ]
        frames.append(build_event_frame("contentBlockStop", {"contentBlockIndex": index}))
    frames.append(build_event_frame("messageStop", {"stopReason": answer["stopReason"]}))
    frames.append(build_event_frame("metadata", {"usage": answer["usage"], "metrics": answer["metrics"]}))
    return frames


def build_event_frame(event_type: str, payload: Mapping[str, Any]) -> bytes:
    """One AWS event-stream frame: prelude (total and headers length, its CRC32), the string headers
    `:message-type` event, `:event-type` and `:content-type` application/json, the JSON payload, the
    message's CRC32."""
    headers = b"".join(
        _string_header(name, value)
        for name, value in (
            (":message-type", "event"),
            (":event-type", event_type),
            (":content-type", "application/json"),
        )
    )
    data = json.dumps(payload).encode()
    prelude = struct.pack("!II", 16 + len(headers) + len(data), len(headers))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + headers + data
    return message + struct.pack("!I", zlib.crc32(message))


def _string_header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    # Header value type 7: a string, its length in two bytes.
    return struct.pack("!B", len(raw_name)) + raw_name + struct.pack("!BH", 7, len(raw_value)) + raw_value


def build_cohere_events(answer: Mapping[str, Any]) -> list[bytes]:
    """A v2 Chat answer as the SSE events Cohere writes: message-start; the tool plan in pieces; each call's
    start (id, name), argument pieces and end; each text block's start, pieces and end; message-end with
    the finish reason and usage."""
    message = answer["message"]
    events: list[dict[str, Any]] = [
        {
            "id": answer["id"],
            "type": "message-start",
            "delta": {"message": {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": []}},
        }
    ]
    if message.get("tool_plan"):
        events += [
            {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": piece}}}
            for piece in split_text(message["tool_plan"])
        ]
    for index, call in enumerate(message.get("tool_calls") or []):
        start = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
        events.append(
            {"type": "tool-call-start", "index": index, "delta": {"message": {"tool_calls": start}}}
        )
        events += [
            {
                "type": "tool-call-delta",
                "index": index,
                "delta": {"message": {"tool_calls": {"function": {"arguments": piece}}}},
            }
            for piece in split_text(call["function"]["arguments"])
        ]
        events.append({"type": "tool-call-end", "index": index})
    for index, block in enumerate(message.get("content") or []):
        start_block = {"type": "text", "text": ""}
        events.append(
            {"type": "content-start", "index": index, "delta": {"message": {"content": start_block}}}
        )
        events += [
            {"type": "content-delta", "index": index, "delta": {"message": {"content": {"text": piece}}}}
            for piece in split_text(block["text"])
        ]
        events.append({"type": "content-end", "index": index})
    events.append(
        {"type": "message-end", "delta": {"finish_reason": answer["finish_reason"], "usage": answer["usage"]}}
    )
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
