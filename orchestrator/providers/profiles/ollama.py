"""Ollama's native /api/chat bodies and NDJSON streams: read (`toolloop normalize`), not called — toolloop
calls Ollama through its OpenAI-compatible /v1 (`openai:` with OPENAI_BASE_URL)."""

from __future__ import annotations

from orchestrator.providers.profile import ProviderProfile

PROFILE = ProviderProfile(
    name="ollama",
    wire="orchestrator.providers.ollama",
    summary="Ollama's native chat bodies (read only; call Ollama as openai: at its /v1)",
    wire_family="ollama",
    endpoint=None,
    detect_rank=60,
    aliases=("ollama_native",),
)
