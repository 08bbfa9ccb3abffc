"""Cohere's v2 Chat API, streamed or not."""

from __future__ import annotations

from orchestrator.providers.profile import Endpoint, ProviderProfile

PROFILE = ProviderProfile(
    name="cohere",
    wire="orchestrator.providers.cohere",
    summary="Cohere's v2 Chat API with COHERE_API_KEY (COHERE_BASE_URL overrides the endpoint)",
    wire_family="cohere",
    endpoint=Endpoint(
        default_base_url="https://api.cohere.com",
        base_url_variable="COHERE_BASE_URL",
        key_variable="COHERE_API_KEY",
        auth="bearer",
    ),
    tool_call_id_max_chars=64,
    unsupported_settings=("parallel_tool_calls",),
    owned_fields=("model", "messages", "stream"),
    max_stop_sequences=5,
    structured_output="json_schema",
    genai_name="cohere",
    prices_provider="cohere",
    aliases=("cohere_v2",),
)
