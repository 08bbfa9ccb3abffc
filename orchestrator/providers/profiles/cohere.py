"""Cohere's v2 Chat API, streamed or not."""

from __future__ import annotations

from orchestrator.model import ModelSettings
from orchestrator.providers.profile import Endpoint, ProviderProfile

# The API reference's ranges: `temperature` 0–1, `p` 0.01–0.99, `seed` from 0, at most 5 stop sequences.
MAX_TEMPERATURE = 1.0
MIN_TOP_P = 0.01
MAX_TOP_P = 0.99
MAX_STOP_SEQUENCES = 5


def check_controls(settings: ModelSettings, tool_choice: str | None) -> list[str]:
    """What Cohere refuses of these settings' values, one message each: a temperature above 1, a top_p
    outside 0.01–0.99, a negative seed. `tool_choice` restricts nothing (every choice has a mapping)."""
    del tool_choice
    refusals: list[str] = []
    if settings.temperature is not None and settings.temperature > MAX_TEMPERATURE:
        refusals.append(
            f"temperature above {MAX_TEMPERATURE:g} is not supported by cohere (got {settings.temperature:g})"
        )
    if settings.top_p is not None and not MIN_TOP_P <= settings.top_p <= MAX_TOP_P:
        refusals.append(
            f"top_p must be between {MIN_TOP_P:g} and {MAX_TOP_P:g} on cohere (got {settings.top_p:g})"
        )
    if settings.seed is not None and settings.seed < 0:
        refusals.append(f"seed must not be negative on cohere (got {settings.seed})")
    return refusals


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
    # Cohere may always call tools in parallel: it has no switch.
    unsupported_settings=("parallel_tool_calls",),
    owned_fields=("model", "messages", "stream"),
    max_stop_sequences=MAX_STOP_SEQUENCES,
    check_controls=check_controls,
    structured_output="json_schema",
    genai_name="cohere",
    prices_provider="cohere",
    detect_rank=60,
    aliases=("cohere_v2",),
)
