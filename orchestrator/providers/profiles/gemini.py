"""The Gemini API (`generateContent`, `streamGenerateContent`) with an API key."""

from __future__ import annotations

from orchestrator.providers.profile import Endpoint, ProviderProfile

PROFILE = ProviderProfile(
    name="gemini",
    wire="orchestrator.providers.gemini",
    summary="the Gemini API with GEMINI_API_KEY (GEMINI_BASE_URL overrides the endpoint)",
    wire_family="gemini",
    endpoint=Endpoint(
        default_base_url="https://generativelanguage.googleapis.com",
        base_url_variable="GEMINI_BASE_URL",
        key_variable="GEMINI_API_KEY",
        auth="header",
        key_header="x-goog-api-key",
    ),
    tool_call_id_max_chars=64,
    unsupported_settings=("parallel_tool_calls",),
    owned_fields=("contents",),
    max_stop_sequences=5,
    structured_output="response_schema",
    genai_name="gcp.gemini",
    prices_provider="google",
    aliases=("google", "gemini_api"),
)
