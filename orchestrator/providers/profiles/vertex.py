"""Gemini on Vertex AI: the same wire as the Gemini API, at a project's endpoint, with a Google OAuth token
(application default credentials, refreshed as they expire; or a static VERTEX_ACCESS_TOKEN)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.model import ModelSettings
from orchestrator.providers.profile import Endpoint, ProviderProfile
from orchestrator.providers.profiles.gemini import MAX_STOP_SEQUENCES, OWNED_FIELDS

if TYPE_CHECKING:
    from orchestrator.providers.sending import RequestAuth

NAME = "vertex"


def build_base_url(values: Mapping[str, str]) -> str | None:
    """The publisher base URL of GOOGLE_CLOUD_PROJECT in GOOGLE_CLOUD_LOCATION; None without a project."""
    # Imported here: a profile is read by the state machine, which loads no auth library.
    from orchestrator.providers.google_auth import build_vertex_base_url

    return build_vertex_base_url(values)


def build_auth(values: Mapping[str, str]) -> RequestAuth:
    """A bearer token per call: VERTEX_ACCESS_TOKEN as given, else application default credentials."""
    from orchestrator.providers.google_auth import build_google_auth

    return build_google_auth(values)


def check_controls(settings: ModelSettings, tool_choice: str | None) -> list[str]:
    """As on the Gemini API: parallel function calls cannot be turned off."""
    del tool_choice
    if settings.parallel_tool_calls is False:
        return [
            f"parallel_tool_calls false is not supported by {NAME}: Gemini may always call tools in parallel"
        ]
    return []


PROFILE = ProviderProfile(
    name=NAME,
    wire="orchestrator.providers.gemini",
    summary=(
        "Gemini on Vertex AI: GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION (or VERTEX_BASE_URL), "
        "application default credentials or VERTEX_ACCESS_TOKEN"
    ),
    wire_family="gemini",
    endpoint=Endpoint(
        default_base_url=None,
        base_url_variable="VERTEX_BASE_URL",
        key_variable="VERTEX_ACCESS_TOKEN",
        auth="google",
        url_builder="build_vertex_url",
        base_url_builder=build_base_url,
        auth_builder=build_auth,
        other_variables=("GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"),
    ),
    tool_call_id_max_chars=64,
    owned_fields=OWNED_FIELDS,
    max_stop_sequences=MAX_STOP_SEQUENCES,
    check_controls=check_controls,
    structured_output="response_schema",
    genai_name="gcp.vertex_ai",
    prices_provider="google",
    aliases=("vertex_ai",),
    extra="vertex",
)
