"""Property: whatever a provider sends, normalising gives a Turn or a ProviderError, never an exception.

Bodies are the recorded ones MUTATED (keys deleted, types swapped, strings truncated, nulls, huge numbers,
nested garbage, bytes cut or corrupted, stream events broken) plus wholly random JSON. Each mutated body goes
through `from_response` (named and detected) and, cross-fed, through every module of this layer.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.model import ProviderError, Turn
from orchestrator.providers import bare, bedrock, cohere, gemini, ollama
from orchestrator.providers.common import IdSource
from orchestrator.providers.detect import from_response
from tests.unit.providers.conftest import RESPONSES_DIR, load_expected

pytestmark = pytest.mark.timeout(60)

EXPECTED = load_expected()
FILES = sorted(EXPECTED)
MY_MODULES = (gemini, ollama, bedrock, cohere, bare)

# Keys the normalisers look at: garbage built from them reaches deep into the code, not just the top level.
VOCABULARY = [
    "candidates",
    "content",
    "parts",
    "text",
    "thought",
    "functionCall",
    "name",
    "args",
    "id",
    "finishReason",
    "usageMetadata",
    "message",
    "tool_calls",
    "function",
    "arguments",
    "type",
    "choices",
    "delta",
    "output",
    "toolUse",
    "toolUseId",
    "input",
    "reasoningContent",
    "reasoningText",
    "tool_plan",
    "done",
    "usage",
    "tokens",
    "error",
    "status",
    "code",
    "stopReason",
    "role",
    "thinking",
    "index",
    "model",
    "modelVersion",
]
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from([*VOCABULARY, "", "null", "{}", "[", "STOP", "tool_use", "assistant"])
)
garbage = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(VOCABULARY) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


def check(result: object) -> None:
    assert isinstance(result, Turn | ProviderError), result
    if isinstance(result, Turn):
        assert (result.type == "tool_calls") == bool(result.tool_calls)
        assert all(call.id for call in result.tool_calls)
        json.dumps(result.model_dump(mode="json"))  # what `toolloop normalize` prints must serialise


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths(child, (*prefix, index))
    return found


def swap_type(value: Any) -> Any:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return "null"


@st.composite
def mutated(draw: st.DrawFn, body: Any) -> Any:
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        candidates = paths(body)
        path = draw(st.sampled_from(candidates))
        if not path:
            if draw(st.booleans()):
                body = draw(garbage)
            continue
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        key, current = path[-1], parent[path[-1]]
        action = draw(st.sampled_from(["delete", "garbage", "null", "swap", "truncate", "huge"]))
        if action == "delete":
            del parent[key]
        elif action == "garbage":
            parent[key] = draw(garbage)
        elif action == "null":
            parent[key] = None
        elif action == "swap":
            parent[key] = swap_type(current)
        elif action == "truncate" and isinstance(current, str):
            parent[key] = current[: draw(st.integers(min_value=0, max_value=len(current)))]
        else:
            parent[key] = draw(st.sampled_from([10**30, -(10**30), 1e308, -1, 2**63]))
    return body


def recorded(name: str) -> tuple[Any, str | None]:
    """A JSON body as an object; a stream as text (None for the object)."""
    path = RESPONSES_DIR / name
    if path.suffix == ".sse":
        return None, path.read_bytes().decode("utf-8")
    return json.loads(path.read_text("utf-8")), None


@st.composite
def mutated_stream(draw: st.DrawFn, text: str) -> str | bytes:
    lines = text.split("\n")
    for index, line in enumerate(lines):
        payload = line.removeprefix("data:").strip()
        if line.startswith("data:") and payload.startswith("{") and draw(st.integers(0, 3)) == 0:
            lines[index] = "data: " + json.dumps(draw(mutated(json.loads(payload))))
    out = "\n".join(lines)
    cut = draw(st.sampled_from(["none", "cut", "corrupt"]))
    if cut == "cut":
        out = out[: draw(st.integers(min_value=0, max_value=len(out)))]
    elif cut == "corrupt":
        raw = bytearray(out.encode())
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    return out


@st.composite
def mutated_body(draw: st.DrawFn, name: str) -> object:
    body, text = recorded(name)
    if text is not None:
        return draw(mutated_stream(text))
    form = draw(st.sampled_from(["object", "text", "bytes_cut"]))
    changed = draw(mutated(body))
    if form == "object":
        return changed
    encoded = json.dumps(changed, ensure_ascii=False)
    if form == "text":
        return encoded
    return encoded.encode()[: draw(st.integers(min_value=0, max_value=len(encoded.encode())))]


@pytest.mark.parametrize("name", FILES)
def test_mutated_bodies_through_from_response(name: str) -> None:
    provider = EXPECTED[name]["provider"]
    status = EXPECTED[name].get("http_status")

    @SETTINGS
    @given(body=mutated_body(name), named=st.booleans(), with_status=st.booleans())
    def run(body: object, named: bool, with_status: bool) -> None:
        ids = IdSource()
        check(
            from_response(
                body, provider=provider if named else None, status=status if with_status else None, ids=ids
            )
        )

    run()


@pytest.mark.parametrize("name", [n for n in FILES if Path(n).suffix == ".json"])
def test_mutated_bodies_cross_fed_to_every_module(name: str) -> None:
    @SETTINGS
    @given(body=mutated(recorded(name)[0]))
    def run(body: object) -> None:
        for module in MY_MODULES:
            check(module.from_wire(body))
            check(module.error_from_wire(None, body))

    run()


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=garbage, provider=st.sampled_from([None, "gemini", "ollama", "bedrock", "cohere", "bare"]))
def test_random_json_never_raises(body: object, provider: str | None) -> None:
    check(from_response(body, provider=provider))
    check(from_response(json.dumps(body), provider=provider))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200), module=st.sampled_from(MY_MODULES))
def test_random_streams_never_raise(text: str, module: Any) -> None:
    check(module.from_stream(text))
    check(module.from_stream("data: " + text + "\n\n"))
