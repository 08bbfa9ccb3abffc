"""The model clients of a process: one per model name, and the in-process scripted server's lifecycle."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from orchestrator.errors import ModelConfigError
from orchestrator.model import Turn, UserMessage
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
