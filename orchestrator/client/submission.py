"""What `Client.submit` and `AsyncClient.submit` take, written once: `build_submission`, and the decorator
that gives both methods its signature (`takes_arguments_of`; `direct.build_direct_call` is the other builder).

A turn request's model controls come in as a caller writes them: `model_settings` a
`ModelSettings` or a mapping, `output_schema` a JSON Schema mapping or a pydantic model class (its
`model_json_schema()`), `model` a name or a list of names (the fallback order). Whether the target provider
honours them is checked when the turn is submitted (`orchestrator.submit_checks`), before anything is stored.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from pydantic import BaseModel

from orchestrator.model import ClientTool, Limits, Message, ModelSettings, TurnPriority, TurnRequest
from orchestrator.store import codec

P = ParamSpec("P")
A = TypeVar("A")
R = TypeVar("R")
S = TypeVar("S")

# A JSON Schema, or the pydantic model class whose schema it is.
OutputSchema = Mapping[str, Any] | type[BaseModel]


@dataclass(frozen=True)
class Submission:
    """A checked turn request, and the id its caller chose for it (None: a new one)."""

    request: TurnRequest
    turn_id: str | None = None


def build_output_schema(output_schema: OutputSchema | None) -> dict[str, Any] | None:
    """The JSON Schema a turn's answer must satisfy: a mapping as it is, a pydantic model class's schema."""
    if output_schema is None:
        return None
    if isinstance(output_schema, type):
        if not issubclass(output_schema, BaseModel):
            raise ValueError(
                f"'output_schema' is a JSON Schema or a pydantic model class, not {output_schema.__name__}"
            )
        return output_schema.model_json_schema()
    if not isinstance(output_schema, Mapping):
        raise ValueError("'output_schema' is a JSON Schema (a mapping) or a pydantic model class")
    return dict(output_schema)


def build_model_names(model: str | Sequence[str] | None) -> str | list[str] | None:
    """`model` as a request carries it: a name, or the list of names tried in order."""
    if model is None or isinstance(model, str):
        return model
    return list(model)


# Positional like the documented `submit(prompt=None, messages=None, …)`.
def build_submission(  # noqa: PLR0917
    prompt: str | None = None,
    messages: Sequence[Message | Mapping[str, Any]] | None = None,
    tools: Sequence[str] | None = None,
    model: str | Sequence[str] | None = None,
    limits: Limits | Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    conversation_id: str | None = None,
    tool_choice: str | None = None,
    *,
    turn_id: str | None = None,
    stream: bool = True,
    instructions: str | None = None,
    model_settings: ModelSettings | Mapping[str, Any] | None = None,
    output_schema: OutputSchema | None = None,
    tenant: str | None = None,
    priority: TurnPriority | None = None,
    client_tools: Sequence[ClientTool | Mapping[str, Any]] | None = None,
    agent: str | None = None,
) -> Submission:
    """A `Submission` from the arguments of `submit` (whose signature this is): a validated `TurnRequest`
    (pydantic's `ValidationError`, a `ValueError`, if bad).

    A turn needs something to answer: a `prompt`, `messages`, or both (the prompt is the last user message).
    `instructions` is the turn's system prompt (kept out of the stored conversation); `model` a name or a list
    tried in order when one fails; `model_settings` how the model is asked (`ModelSettings`); `output_schema`
    the JSON Schema (or pydantic model class) of the answer, whose parsed JSON is the outcome's `output`
    (`TurnOutcome.parse(Model)` gives the typed object). `tenant` is whose turn it is (None: "default"), a
    short identifier: tools get it as `ctx.tenant`, and over HTTP an API key sees only its tenant's turns.
    `priority` is its lane (None: "normal"): "interactive" turns are claimed before "normal" ones and those
    before "batch" ones, and their tool calls go before theirs in the tools' queues. `client_tools` are tools
    the caller runs itself (`ClientTool`: name, description, JSON Schema `parameters`): a call of one waits
    for `submit_tool_result`. `agent` names a named agent the turn runs as (`list_agents`): its instructions,
    model, tools, settings and output schema, for each of those the turn does not set itself.
    """
    if isinstance(tools, str):
        raise ValueError("'tools' is a list of tool names, not a string")
    raw: dict[str, Any] = {
        "prompt": prompt,
        "messages": list(messages or []),
        "tools": list(tools) if tools is not None else None,
        "model": build_model_names(model),
        "context": dict(context or {}),
        "conversation_id": conversation_id,
        "tool_choice": tool_choice,
        "stream": stream,
        "instructions": instructions,
        "output_schema": build_output_schema(output_schema),
    }
    if tenant is not None:
        raw["tenant"] = tenant
    if priority is not None:
        raw["priority"] = priority
    if agent is not None:
        raw["agent"] = agent
    if client_tools:
        raw["client_tools"] = [t.model_dump() if isinstance(t, BaseModel) else dict(t) for t in client_tools]
    if limits is not None:
        raw["limits"] = limits.model_dump() if isinstance(limits, BaseModel) else limits
    if model_settings is not None:
        raw["model_settings"] = (
            model_settings.model_dump() if isinstance(model_settings, BaseModel) else model_settings
        )
    request = TurnRequest.model_validate(raw)
    codec.check_turn_request(request)
    return Submission(request, turn_id)


def takes_arguments_of(
    build: Callable[P, A],
) -> Callable[[Callable[[S, A], R]], Callable[Concatenate[S, P], R]]:
    """Give a method `build`'s parameters: the method receives what `build` makes of its caller's arguments.

    Both for static typing (`ParamSpec`) and at run time: `inspect.signature` and `help()` show `build`'s
    parameters. A coroutine method stays a coroutine function, and calls `build` when awaited, so bad input
    raises where the call is awaited, as from any other coroutine.
    """

    def decorate(method: Callable[[S, A], R]) -> Callable[Concatenate[S, P], R]:
        def call(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            return method(self, build(*args, **kwargs))

        async def call_async(self: S, *args: P.args, **kwargs: P.kwargs) -> Any:
            return await cast(Awaitable[Any], method(self, build(*args, **kwargs)))

        wrapper: Callable[..., Any] = call_async if inspect.iscoroutinefunction(method) else call
        functools.update_wrapper(wrapper, method)
        own, built = inspect.signature(method), inspect.signature(build)
        self_parameter = next(iter(own.parameters.values()))
        # `inspect.signature` (so `help`) reports this instead of following `__wrapped__` to the method.
        wrapper.__signature__ = built.replace(  # type: ignore[attr-defined]  # mypy's functions lack it
            parameters=[self_parameter, *built.parameters.values()], return_annotation=own.return_annotation
        )
        return cast(Callable[Concatenate[S, P], R], wrapper)

    return decorate
