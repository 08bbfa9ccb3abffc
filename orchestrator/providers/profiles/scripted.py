"""toolloop's own deterministic model: plays the plan a prompt names, over the Chat Completions wire."""

from __future__ import annotations

from orchestrator.providers.profile import Endpoint, ProviderProfile

PROFILE = ProviderProfile(
    name="scripted",
    wire="orchestrator.providers.openai_chat",
    summary="toolloop's deterministic model (the demo, the tests, the bench); served in process by default",
    wire_family="openai_chat",
    endpoint=Endpoint(default_base_url=None, base_url_variable="TOOLLOOP_SCRIPTED_BASE_URL", auth="none"),
    tool_call_id_max_chars=40,
    owned_fields=("model", "messages", "stream", "stream_options"),
    max_stop_sequences=4,
    structured_output="json_schema",
    free=True,
    # It plays a plan and reads no context: nothing to fit unless TOOLLOOP_CONTEXT_WINDOWS names a window.
    unbounded_context=True,
    serves_itself=True,
)
