"""OpenAI Chat Completions, and every server that speaks it (vLLM, Ollama's /v1, Groq, LiteLLM …)."""

from __future__ import annotations

from orchestrator.providers.profile import Endpoint, ProviderProfile

# OpenAI's published schema takes at most four stop sequences (`StopConfiguration`).
CHAT_MAX_STOP_SEQUENCES = 4

PROFILE = ProviderProfile(
    name="openai",
    wire="orchestrator.providers.openai_chat",
    summary="OpenAI Chat Completions, or any compatible server at OPENAI_BASE_URL",
    wire_family="openai_chat",
    endpoint=Endpoint(
        default_base_url="https://api.openai.com/v1",
        base_url_variable="OPENAI_BASE_URL",
        key_variable="OPENAI_API_KEY",
        auth="bearer",
    ),
    # OpenAI Chat rejects tool-call ids over 40 characters.
    tool_call_id_max_chars=40,
    owned_fields=("model", "messages", "stream", "stream_options"),
    max_stop_sequences=CHAT_MAX_STOP_SEQUENCES,
    structured_output="json_schema",
    genai_name="openai",
    prices_provider="openai",
    # Vendors and servers whose bodies are Chat Completions' (`toolloop normalize --provider groq`).
    detect_rank=20,
    unmistakable=True,
    aliases=(
        "openai_chat",
        "openai_compat",
        "openai_compatible",
        "chat_completions",
        "gemini_openai_compat",
        "ollama_openai_compat",
        "deepseek",
        "groq",
        "mistral",
        "xai",
        "grok",
        "together",
        "together_hf",
        "huggingface",
        "hf",
        "vllm",
        "vllm_crusoe",
        "crusoe",
        "openrouter",
        "lmstudio",
        "lm_studio",
        "llamacpp",
        "llama_cpp",
        "fireworks",
        "perplexity",
        "azure",
        "azure_openai",
        "cerebras",
        "sambanova",
        "deepinfra",
        "nvidia",
        "nim",
        "moonshot",
        "kimi",
        "dashscope",
        "qwen",
        "zai",
        "glm",
    ),
)
