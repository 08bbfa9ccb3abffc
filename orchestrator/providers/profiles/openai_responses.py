"""The OpenAI Responses API, at the same base URL and key as Chat Completions."""

from __future__ import annotations

from orchestrator.providers.profile import Endpoint, ProviderProfile

PROFILE = ProviderProfile(
    name="openai_responses",
    wire="orchestrator.providers.openai_responses",
    summary="the OpenAI Responses API at OPENAI_BASE_URL",
    wire_family="openai_responses",
    endpoint=Endpoint(
        default_base_url="https://api.openai.com/v1",
        base_url_variable="OPENAI_BASE_URL",
        key_variable="OPENAI_API_KEY",
        auth="bearer",
    ),
    tool_call_id_max_chars=64,
    unsupported_settings=("stop", "seed"),
    owned_fields=("model", "input", "stream"),
    structured_output="json_schema",
    genai_name="openai",
    prices_provider="openai",
    detect_rank=30,
    unmistakable=True,
    aliases=("responses",),
)
