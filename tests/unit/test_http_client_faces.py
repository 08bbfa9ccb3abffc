"""The HTTP clients are the Redis clients' faces over the API: `HttpClient` has `Client`'s public methods and
`AsyncHttpClient` `AsyncClient`'s, with the same signatures (parameters, defaults, annotations, return types)
and the same awaitability, so that swapping one for the other changes no caller and neither can drift.

The constructors differ by nature (a Redis URL and settings, a base URL and a token); the Redis clients'
properties (`redis`, `block_cap_ms`) are Redis's and not methods.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from orchestrator import AsyncClient, AsyncHttpClient, Client, HttpClient

pytestmark = pytest.mark.timeout(10)

PAIRS = [(Client, HttpClient), (AsyncClient, AsyncHttpClient)]
CONTEXT_MANAGERS = {"__enter__", "__exit__", "__aenter__", "__aexit__"}


def public_methods(cls: type) -> dict[str, Callable[..., object]]:
    """The methods a caller calls: public functions and the context-manager protocol, not the constructor."""
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") or name in CONTEXT_MANAGERS
    }


def shown(signature: inspect.Signature, cls: type) -> str:
    # `__enter__` returns its own class: compared as "Self".
    return str(signature).replace(f"-> '{cls.__name__}'", "-> Self")


@pytest.mark.parametrize(("redis_face", "http_face"), PAIRS, ids=["sync", "async"])
def test_the_http_face_has_the_redis_faces_methods_and_signatures(redis_face: type, http_face: type) -> None:
    redis_methods, http_methods = public_methods(redis_face), public_methods(http_face)
    assert sorted(http_methods) == sorted(redis_methods)
    for name, redis_method in redis_methods.items():
        http_method = http_methods[name]
        redis_signature, http_signature = inspect.signature(redis_method), inspect.signature(http_method)
        assert shown(http_signature, http_face) == shown(redis_signature, redis_face), name
        # Awaited on one face, awaited on the other (an async iterator is returned by both, awaited by none).
        assert inspect.iscoroutinefunction(http_method) == inspect.iscoroutinefunction(redis_method), name


@pytest.mark.parametrize("face", [HttpClient, AsyncHttpClient])
def test_every_public_name_of_the_http_faces_has_a_docstring(face: type) -> None:
    # The reference pages render them (mkdocstrings); the protocol's dunders say nothing a reader needs.
    undocumented = [
        name
        for name, method in public_methods(face).items()
        if name not in CONTEXT_MANAGERS and not method.__doc__
    ]
    assert face.__doc__ and undocumented == []


def test_the_signature_check_sees_a_drift() -> None:
    class Drifted(HttpClient):
        def wait(self, turn_id: str, timeout: float = 5.0) -> None:  # type: ignore[override]  # the drift
            """A default the Redis client does not have, and another return type."""

    drifted, original = inspect.signature(Drifted.wait), inspect.signature(Client.wait)
    assert shown(drifted, Drifted) != shown(original, Client)
