"""The @tool decorator: schema, docstring, guardrails at definition, sensitive filter, context."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers import ToolContext, tool
from workers.tools import (
    ToolDefinitionError,
    ToolRegistry,
    build_listing,
    is_sensitive_name,
    split_name_words,
)


@pytest.fixture
def reg() -> ToolRegistry:
    return ToolRegistry()


def test_bare_decorator_builds_schema_and_description(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def add(a: int, b: int = 2) -> int:
        """Add two integers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    spec = add.spec
    assert spec.name == "add"
    assert spec.description == "Add two integers."
    assert spec.parameters["type"] == "object"
    assert spec.parameters["required"] == ["a"]
    assert spec.parameters["additionalProperties"] is False
    assert spec.parameters["properties"]["a"] == {
        "type": "integer",
        "title": "A",
        "description": "the first number",
    }
    assert spec.parameters["properties"]["b"]["default"] == 2
    assert "title" not in spec.parameters
    assert reg.get("add") is add


def test_plain_callable_in_process() -> None:
    reg = ToolRegistry()

    @tool(registry=reg, soft_time_limit=1)
    def multiply(a: float, b: float) -> float:
        """Multiply."""
        return a * b

    assert multiply(3, 4) == 12
    assert multiply.invoke({"a": "3", "b": 4}) == 12.0
    with pytest.raises(ValidationError):
        multiply.invoke({"a": "x", "b": 4})
    assert multiply.spec.time_limit_s == 2.0


def test_bare_at_tool_registers_in_default_registry() -> None:
    from workers.tools import registry

    @tool
    def unit_test_bare_tool(q: str) -> str:
        """Echo."""
        return q

    assert registry.get("unit_test_bare_tool") is unit_test_bare_tool
    assert unit_test_bare_tool("x") == "x"


def test_annotated_field_and_literal(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def weather(
        city: Annotated[str, Field(description="City name", min_length=1)],
        unit: Literal["c", "f"] = "c",
    ) -> dict[str, Any]:
        """Weather."""
        return {"city": city, "unit": unit}

    props = weather.spec.parameters["properties"]
    assert props["city"]["description"] == "City name"
    assert props["city"]["minLength"] == 1
    assert props["unit"]["enum"] == ["c", "f"]


class Query(BaseModel):
    """A search query."""

    text: str
    limit: int = 5


def test_single_pydantic_model_input(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def search(query: Query) -> list[str]:
        """Search."""
        return [query.text] * query.limit

    assert search.spec.parameters["properties"]["text"]["type"] == "string"
    assert search.spec.parameters["required"] == ["text"]
    assert search.invoke({"text": "a", "limit": 2}) == ["a", "a"]
    # The model decides unknown arguments, as docs/guides/tools.md says: pydantic's default ignores them.
    assert search.invoke({"text": "a", "limit": 1, "bogus": 1}) == ["a"]


class StrictQuery(Query):
    model_config = ConfigDict(extra="forbid")


def test_a_single_model_that_forbids_extras_refuses_unknown_arguments(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def strict_search(query: StrictQuery) -> str:
        """Search."""
        return query.text

    assert strict_search.spec.parameters["additionalProperties"] is False
    with pytest.raises(ValidationError, match="bogus"):
        strict_search.invoke({"text": "a", "bogus": 1})


def test_context_parameter_not_in_schema_and_received(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def whoami(greeting: str, ctx: ToolContext) -> str:
        """Greet the user."""
        return f"{greeting} {ctx.context['user']} {ctx.call_id} {ctx.attempt}"

    assert list(whoami.spec.parameters["properties"]) == ["greeting"]
    ctx = ToolContext(call_id="c1", attempt=2, context={"user": "ann"})
    assert whoami.invoke({"greeting": "hi"}, ctx) == "hi ann c1 2"


def test_async_tool(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    async def later(x: int) -> int:
        """Async."""
        return x + 1

    assert later.invoke({"x": 1}) == 2


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"soft_time_limit": 0}, "soft_time_limit must be a positive"),
        ({"time_limit": -1}, "time_limit must be a positive"),
        ({"soft_time_limit": 5, "time_limit": 5}, "must be less than time_limit"),
        ({"soft_time_limit": 6, "time_limit": 5}, "must be less than time_limit"),
        ({"retries": -1}, "retries must be 0 or more"),
        ({"retry_backoff": 0}, "retry_backoff must be positive"),
        ({"max_args_bytes": 0}, "max_args_bytes must be a positive"),
        ({"max_result_bytes": -5}, "max_result_bytes must be a positive"),
        ({"idempotency": "yes"}, "idempotency must be None, 'args' or 'key:<fixed key>'"),
        ({"idempotency": "key:"}, "idempotency must be"),
        ({"queue": ""}, "queue must be a non-empty"),
        ({"name": "bad name!"}, "is not valid"),
    ],
)
def test_bad_guardrails_fail_at_definition(options: dict[str, Any], fragment: str) -> None:
    reg = ToolRegistry()
    with pytest.raises(ToolDefinitionError, match=fragment.replace("(", r"\(")):

        @tool(registry=reg, **options)
        def t(x: int) -> int:
            """T."""
            return x

    assert len(reg) == 0


def test_duplicate_name_fails_loudly(reg: ToolRegistry) -> None:
    @tool(registry=reg, name="same")
    def one() -> int:
        """One."""
        return 1

    with pytest.raises(ToolDefinitionError, match="duplicate tool name 'same'"):

        @tool(registry=reg, name="same")
        def two() -> int:
            """Two."""
            return 2


def test_var_args_refused(reg: ToolRegistry) -> None:
    with pytest.raises(ToolDefinitionError, match=r"\*args"):

        @tool(registry=reg)
        def f(*items: int) -> int:
            """F."""
            return 0


def test_valid_idempotency_specs(reg: ToolRegistry) -> None:
    @tool(registry=reg, idempotency="args")
    def a() -> int:
        """A."""
        return 1

    @tool(registry=reg, idempotency="key:daily-report")
    def b() -> int:
        """B."""
        return 1

    assert (a.spec.idempotency, b.spec.idempotency) == ("args", "key:daily-report")


@pytest.mark.parametrize(
    ("name", "sensitive"),
    [
        ("delete_user", True),
        ("run-shell", True),
        ("ShellExec", True),
        ("readConfig", True),
        ("system.info", True),
        ("getAuthToken", True),
        ("file_read", True),
        ("profile", False),
        ("author", False),
        ("get_user_profile", False),
        ("authors_list", False),
        ("filename_check", False),
        ("add", False),
        ("HTTPFetch", False),
    ],
)
def test_sensitive_words_are_whole_words(name: str, sensitive: bool) -> None:
    assert is_sensitive_name(name) is sensitive


def test_split_name_words() -> None:
    assert split_name_words("getHTTPResponse_v2-x.y") == ["get", "http", "response", "v", "2", "x", "y"]


def test_effective_sensitivity_in_spec(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def drop_table() -> None:
        """Drop."""

    @tool(registry=reg, sensitive=True)
    def payroll() -> None:
        """Payroll."""

    @tool(registry=reg, sensitive=False)
    def delete_row() -> None:
        """Name wins: a sensitive word cannot be declared public."""

    @tool(registry=reg)
    def profile() -> None:
        """Public."""

    assert [s.name for s in reg.specs() if s.sensitive] == ["delete_row", "drop_table", "payroll"]
    assert [s.name for s in reg.list_tools()] == ["profile"]
    assert [s.name for s in reg.list_tools(include_sensitive=True)] == [
        "delete_row",
        "drop_table",
        "payroll",
        "profile",
    ]
    # The allowlist comes after the sensitive filter and cannot bring a sensitive tool back.
    assert [s.name for s in reg.list_tools(allowlist=["payroll", "profile"])] == ["profile"]
    assert [s.name for s in build_listing(reg.specs(), include_sensitive=True, allowlist=["payroll"])] == [
        "payroll"
    ]


def test_listing_exposes_metadata_only(reg: ToolRegistry) -> None:
    @tool(registry=reg)
    def ping() -> str:
        """Ping."""
        return "pong"

    dumped = reg.list_tools()[0].model_dump()
    assert dumped["name"] == "ping"
    assert not any(callable(v) for v in dumped.values())


def test_on_add_listener(reg: ToolRegistry) -> None:
    seen: list[str] = []
    reg.on_add(lambda t: seen.append(t.name))

    @tool(registry=reg)
    def newcomer() -> None:
        """New."""

    assert seen == ["newcomer"]
