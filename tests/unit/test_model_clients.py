"""The model clients of a process: one per model name, and the in-process scripted server's lifecycle."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from orchestrator.errors import ModelConfigError
from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.registry import ModelClients
from orchestrator.settings import Settings

pytestmark = pytest.mark.timeout(20)


async def test_a_scripted_model_starts_one_server_once_and_close_stops_it() -> None:
    async with httpx.AsyncClient() as http:
        models = ModelClients(Settings(scripted_base_url=None), http, max_retries=0)
        assert models.scripted_base_url is None
        echo, demo = await asyncio.gather(models.get("scripted:echo"), models.get("scripted:demo"))
        base_url = models.scripted_base_url
        assert base_url is not None and base_url.startswith("http://127.0.0.1:")
        assert await models.get("scripted:echo") is echo
        assert demo is not echo
        answer = await echo.complete(ModelRequest(model="echo", messages=[UserMessage(content="ping")]))
        assert isinstance(answer, Turn) and answer.text == "ping"
        await models.aclose()
        assert models.scripted_base_url is None
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{base_url}/models")
        await models.aclose()  # closing twice is harmless


async def test_a_configured_scripted_url_starts_no_server() -> None:
    async with httpx.AsyncClient() as http:
        models = ModelClients(Settings(scripted_base_url="http://127.0.0.1:9/v1"), http)
        client = await models.get("scripted:plan")
        assert client.provider == "scripted"
        assert models.scripted_base_url is None
        await models.aclose()


@pytest.mark.parametrize("model", ["nowhere:model-x", "huge", "openai:"])
async def test_a_name_no_client_serves_is_a_model_config_error(model: str) -> None:
    async with httpx.AsyncClient() as http:
        models = ModelClients(Settings(), http)
        with pytest.raises(ModelConfigError):
            await models.get(model)
        assert models.scripted_base_url is None


NO_KEYS: dict[str, str] = {}


@pytest.mark.parametrize(
    ("model", "settings", "variable"),
    [
        ("openai:gpt-4.1-mini", {}, "OPENAI_API_KEY"),
        ("openai_responses:gpt-4.1", {"OPENAI_BASE_URL": "https://api.openai.com/v1/"}, "OPENAI_API_KEY"),
        ("gemini:gemini-2.5-flash", {}, "GEMINI_API_KEY"),
        ("cohere:command-a-03-2025", {}, "COHERE_API_KEY"),
        ("anthropic:claude-sonnet-4-5", {}, "ANTHROPIC_API_KEY"),
    ],
)
async def test_a_providers_own_api_without_its_key_fails_at_once_naming_the_variable(
    model: str, settings: dict[str, str], variable: str
) -> None:
    async with httpx.AsyncClient() as http:
        models = ModelClients(Settings(provider_env={**NO_KEYS, **settings}), http, max_retries=0)
        client = await models.get(model)
        error = await client.complete(ModelRequest(model="m", messages=[UserMessage(content="hi")]))
    assert isinstance(error, ProviderError)
    assert (error.type, error.retryable, error.provider) == (
        "missing_api_key",
        False,
        model.partition(":")[0],
    )
    assert variable in error.message and "orchestrator" in error.message
    # A local OpenAI-compatible server needs no key: its client really calls it.
    local = Settings(provider_env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    async with httpx.AsyncClient() as http:
        client = await ModelClients(local, http, max_retries=0).get("openai:llama3.1")
        error = await client.complete(ModelRequest(model="llama3.1", messages=[UserMessage(content="hi")]))
    assert isinstance(error, ProviderError) and error.type == "transport_error"
