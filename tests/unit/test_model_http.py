"""Which transport an orchestrator's model calls take (`providers.transport.build_model_http`).

The model transport speaks to the model's server directly; httpx honours `HTTP(S)_PROXY` only on its own
transport, so with a proxy in the environment the model calls go there (through the proxy) instead.
"""

from __future__ import annotations

import httpx
import pytest

from orchestrator.providers.transport import ModelTransport, build_model_http

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def test_without_a_proxy_model_calls_take_the_model_transport(no_proxy_env: pytest.MonkeyPatch) -> None:
    async with build_model_http(7) as http:
        transport = http._transport_for_url(httpx.URL("https://api.openai.com/v1/chat/completions"))
        assert isinstance(transport, ModelTransport)


async def test_with_a_proxy_they_take_httpx_own_transport_through_it(
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    no_proxy_env.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    async with build_model_http(7) as http:
        transport = http._transport_for_url(httpx.URL("https://api.openai.com/v1/chat/completions"))
        assert isinstance(transport, httpx.AsyncHTTPTransport) and not isinstance(transport, ModelTransport)
        assert transport is not http._transport  # the proxy's mount, not the direct transport
