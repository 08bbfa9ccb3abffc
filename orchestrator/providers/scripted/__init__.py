"""The scripted model: the project's own deterministic model, spoken to over the OpenAI Chat Completions wire.

    brain    the decision: a request body in, a reply out — the `demo`, `plan` and `echo` models (pure)
    demo     the `demo` model: arithmetic and weather questions answered with the demo tools (pure)
    typed    the `demo` model's answer as a JSON object when the request asks for a JSON Schema (pure)
    conversation  reading the request's messages: the user's text, tool results, rounds (pure)
    wire     the reply as OpenAI bodies: completions, stream chunks, errors with `Retry-After` (pure)
    server   the HTTP server around the brain, in the current event loop or as its own process
             (`python -m orchestrator.providers.scripted.server --port P`)

A process starts the in-process server only through `providers.registry.ModelClients` (or the demo).
"""
