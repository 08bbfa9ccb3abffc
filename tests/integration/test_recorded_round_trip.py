"""Every recorded body of ../shared/provider_responses that toolloop can call, read through the real client.

Each recorded file whose provider has a callable profile (`providers.profiles`: OpenAI Chat and the servers
that speak it, OpenAI Responses, Anthropic, Gemini, Bedrock, Cohere) is served by a local HTTP server at the
path its provider's client posts to, and asked for through `registry.build_model_client` with settings
pointing every provider at that server: a recorded stream (`.sse`) as `text/event-stream` to a streamed call
with a delta sink, a recorded body as plain JSON to a call that does not stream (Bedrock's recorded bodies
are Converse JSON), an error body with its recorded status. The answer equals what expected.json says, by
the rules of `tests/unit/providers/test_expected.py`; a stream's text deltas add up to the Turn's text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers.base import ModelRef, ModelRequest
from orchestrator.providers.deltas import Delta, TextDelta
from orchestrator.providers.profiles import find_profile
from orchestrator.providers.registry import build_model_client
from orchestrator.settings import Settings
from tests.support.api_server import serving_in_loop
from tests.unit.providers.conftest import RESPONSES_DIR, load_expected
from tests.unit.providers.test_expected import check_error, check_turn

pytestmark = pytest.mark.timeout(30)

# The model each provider is asked for when the body names none (Bedrock's never does: it is in the URL).
DEFAULT_MODELS = {"bedrock": "anthropic.claude-3-5-sonnet-20240620-v1:0"}
# The path each profile's client posts to, streamed or not (`{model}` is the model as the URL writes it).
PATHS = {
    "openai": ("/v1/chat/completions", "/v1/chat/completions"),
    "openai_responses": ("/v1/responses", "/v1/responses"),
    "anthropic": ("/v1/messages", "/v1/messages"),
    "gemini": ("/v1beta/models/{model}:generateContent", "/v1beta/models/{model}:streamGenerateContent"),
    "bedrock": ("/model/{model}/converse", "/model/{model}/converse-stream"),
    "cohere": ("/v2/chat", "/v2/chat"),
}
AWS_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIARECORDEDTEST0001",
    "AWS_SECRET_ACCESS_KEY": "recorded/round/trip/secret/000000000000",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def callable_cases() -> list[dict[str, Any]]:
    """expected.json's entries whose provider toolloop can call (`ollama_native` it only reads)."""
    cases = []
    for expected in load_expected().values():
        profile = find_profile(expected["provider"])
        if profile is not None and profile.callable:
            cases.append(expected)
    return cases


CASES = callable_cases()


@dataclass
class Served:
    """What the server answers (one recorded file, with its status) and the paths it was asked at."""

    content: bytes = b""
    status: int = 200
    media_type: str = "application/json"
    paths: list[str] = field(default_factory=list)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Served, str]]:
    answer = Served()

    async def reply(request: Request) -> Response:
        await request.body()
        answer.paths.append(bytes(request.scope["raw_path"]).decode("ascii"))
        return Response(answer.content, answer.status, media_type=answer.media_type)

    app = Starlette(routes=[Route("/{path:path}", reply, methods=["POST"])])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    async with serving_in_loop(server, "the recorded-body server") as url:
        yield answer, url


def build_settings(url: str) -> Settings:
    """Every callable provider pointed at `url`, with a key each (Bedrock's credentials are the
    environment's: `AWS_TEST_CREDENTIALS`)."""
    return Settings(
        provider_env={
            "OPENAI_BASE_URL": f"{url}/v1",
            "OPENAI_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "ak-test",
            "GEMINI_BASE_URL": url,
            "GEMINI_API_KEY": "gk-test",
            "COHERE_BASE_URL": url,
            "COHERE_API_KEY": "ck-test",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": url,
        }
    )


@pytest.mark.parametrize("expected", CASES, ids=lambda e: e["file"])
async def test_a_recorded_answer_read_through_the_real_client(
    expected: dict[str, Any],
    served: tuple[Served, str],
    http: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in AWS_TEST_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    answer, url = served
    path = RESPONSES_DIR / expected["file"]
    streamed = path.suffix == ".sse"
    answer.content = path.read_bytes()
    answer.status = expected.get("http_status", 200)
    answer.media_type = "text/event-stream" if streamed else "application/json"
    profile = find_profile(expected["provider"])
    assert profile is not None
    model = expected.get("model") or DEFAULT_MODELS.get(profile.name, "recorded-model")
    client = build_model_client(ModelRef(profile.name, model), build_settings(url), http, max_retries=0)
    deltas: list[Delta] = []

    async def sink(delta: Delta) -> None:
        deltas.append(delta)

    request = ModelRequest(
        model=model, messages=[UserMessage(content="What is recorded here?")], stream=streamed
    )
    result = await client.complete(request, sink if streamed else None)
    if expected.get("kind") == "error":
        check_error(result, expected)
        assert isinstance(result, ProviderError) and result.provider == profile.name
    else:
        check_turn(result, expected)
        assert isinstance(result, Turn) and result.provider == profile.name
    (asked,) = answer.paths
    assert asked == build_path(profile.name, model, streamed=streamed)
    if streamed:
        assert deltas, "a recorded stream reached the client as deltas"
        text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
        assert isinstance(result, Turn) and text == (result.text or "")


def build_path(provider: str, model: str, *, streamed: bool) -> str:
    """The path a call of `model` posts to, the model percent-encoded as each provider's URL writes it."""
    plain, stream = PATHS[provider]
    template = stream if streamed else plain
    return template.format(model=model.replace(":", "%3A"))


def test_every_callable_recorded_file_is_served() -> None:
    # The recorded bodies of a provider toolloop only reads are the only ones left out.
    names = {e["file"] for e in CASES}
    left_out = {e["file"] for e in load_expected().values()} - names
    assert left_out == {"ollama_native__tool_call_args_object_no_id.json"}
    assert all((RESPONSES_DIR / name).is_file() for name in names)
