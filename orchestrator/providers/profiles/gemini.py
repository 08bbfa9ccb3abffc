"""The Gemini API (`generateContent`, `streamGenerateContent`) with an API key."""

from __future__ import annotations

from orchestrator.model import ModelSettings
from orchestrator.providers.profile import Endpoint, ProviderProfile

NAME = "gemini"
# The body fields toolloop builds, which `extra` may not replace (the model and streaming are in the URL: a
# `model` or `stream` field would only be refused by Gemini).
OWNED_FIELDS = ("model", "contents", "stream")
# Gemini's GenerationConfig takes at most five stop sequences.
MAX_STOP_SEQUENCES = 5


def check_controls(settings: ModelSettings, tool_choice: str | None) -> list[str]:
    """Gemini has no switch for parallel function calls: asking for them (true) is what it does anyway,
    asking it not to (false) is refused."""
    del tool_choice  # every choice maps onto functionCallingConfig
    if settings.parallel_tool_calls is False:
        return [
            f"parallel_tool_calls false is not supported by {NAME}: Gemini may always call tools in parallel"
        ]
    return []


PROFILE = ProviderProfile(
    name=NAME,
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
    owned_fields=OWNED_FIELDS,
    max_stop_sequences=MAX_STOP_SEQUENCES,
    check_controls=check_controls,
    structured_output="response_schema",
    genai_name="gcp.gemini",
    prices_provider="google",
    detect_rank=10,
    unmistakable=True,
    aliases=("google", "gemini_api"),
)
