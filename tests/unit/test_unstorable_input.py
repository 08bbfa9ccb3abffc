"""Turn input that JSON in UTF-8 cannot carry (non-finite numbers, unpaired surrogates) is refused with a
ValueError naming the field, by the codec and by both Python clients, before anything reaches Redis."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from orchestrator import AsyncClient, Client
from orchestrator.api.app import build_safe_json, build_validation_detail
from orchestrator.client.redis_client import build_submission
from orchestrator.settings import Settings
from orchestrator.store.codec import find_unstorable_value

pytestmark = pytest.mark.timeout(10)

# Nothing listens on port 1: a submit that got as far as Redis would fail with a ConnectionError instead.
NOWHERE = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": 1.5, "b": ["x", {"c": None}], "d": True}, None),
        ("emoji \U0001f600 and accents é", None),
        ({"a": math.nan}, "a: nan is not a JSON number"),
        ({"a": [1, {"b": -math.inf}]}, "a[1].b: -inf is not a JSON number"),
        (math.inf, "value: inf is not a JSON number"),
        ("ok\ud800", "value: an unpaired surrogate \\ud800 at index 2"),
        ({"k": ("x", "\udfff")}, "k[1]: an unpaired surrogate \\udfff at index 0"),
        ({"outer": {"\ud83d": 1}}, "outer: a key holds an unpaired surrogate \\ud83d"),
    ],
)
def test_find_unstorable_value(value: Any, expected: str | None) -> None:
    found = find_unstorable_value(value)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.startswith(expected), found
        found.encode("utf-8")  # the message itself is always printable


def test_a_value_nested_past_the_recursion_limit_is_walked() -> None:
    deep: Any = math.nan
    for _ in range(5000):
        deep = [deep]
    found = find_unstorable_value({"c": deep})
    assert found is not None and "nan is not a JSON number" in found


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt": "\ud800"},
        {"prompt": "x", "context": {"score": math.nan}},
        {"prompt": "x", "limits": {"deadline_s": math.inf}},
        {"messages": [{"role": "user", "content": "half \udc00 pair"}]},
        {"prompt": "x", "conversation_id": "conv-\ud800"},
    ],
)
def test_both_clients_refuse_unstorable_input(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"not a JSON number|unpaired surrogate"):
        build_submission(**kwargs)
    settings = Settings(redis_url=NOWHERE)
    with Client(NOWHERE, settings=settings) as client, pytest.raises(ValueError, match=r"JSON|surrogate"):
        client.submit(**kwargs)


async def test_the_async_client_refuses_unstorable_input() -> None:
    async with AsyncClient(NOWHERE, settings=Settings(redis_url=NOWHERE)) as client:
        with pytest.raises(ValueError, match="unpaired surrogate"):
            await client.submit(prompt="\ud800")
        with pytest.raises(ValueError, match="nan is not a JSON number"):
            await client.submit(prompt="x", context={"n": math.nan})


def test_validation_detail_renders_whatever_the_error_holds() -> None:
    errors = [
        {
            "type": "extra_forbidden",
            "loc": ("body", "\ud800"),
            "msg": "Extra inputs are not permitted",
            "input": {"x": math.nan},
            "ctx": {"error": ValueError("bad \udc00"), "limit": math.inf},
        }
    ]
    detail = build_validation_detail(errors)
    text = json.dumps(detail, allow_nan=False).encode("utf-8")
    assert "input" not in detail[0] and b"nan" not in text.lower()
    assert detail[0]["loc"] == ["body", "\\ud800"]
    assert detail[0]["ctx"] == {"error": "bad \\udc00", "limit": "inf"}
    assert build_safe_json([1, None, True, -math.inf]) == [1, None, True, "-inf"]
