"""Named agents: an agent is data — a name, instructions, a model, the tools it may call (tools of the
catalogue, and other agents, which it calls as sub-agents), the agents it may hand off to, model settings and
an output schema.

Declared in a tool module beside the tools (`from workers import agent`)::

    agent("researcher", instructions="Find sources and summarise them.", tools=["search", "fetch"],
          model="smart", description="Researches a question and answers with sources.")

or registered through the clients (`Client.register_agent`). Workers publish the agents their modules
declare with their catalogue (`workers.catalogue`): the `keys.AGENTS` hash, name → spec, which every
orchestrator, the API and the clients read. An agent is not tied to a worker: the last one published wins.

An agent named in another's `tools` is offered to the model as a tool of that name (a *sub-agent*: calling it
runs a child turn as that agent); one named in `handoffs` is offered as `transfer_to_<name>` (a *handoff*:
calling it continues the same turn as that agent). The orchestrator resolves both (`orchestrator.agents`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.errors import ToolDefinitionError

AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,47}$")
# The tool a handoff is offered as: `transfer_to_billing`. Within tool names' 64 characters.
HANDOFF_PREFIX = "transfer_to_"
# What a sub-agent takes when it declares no input of its own: the task, in words.
DEFAULT_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "The task for the agent, in full."}},
    "required": ["prompt"],
    "additionalProperties": False,
}


class AgentSpec(BaseModel):
    """One named agent, as published in Redis and read by every orchestrator.

    `model` is a `provider:model`, a tier, or a fallback list; None: the orchestrator's default. `tools`
    names catalogue tools and other agents (sub-agents) alike; `handoffs` names the agents it may transfer
    the turn to. `model_settings` are the turn's `model_settings` (checked when a turn runs as the agent);
    `input_schema` is what a parent passes it as a sub-agent (default: one string, `prompt`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    instructions: str | None = None
    model: str | list[str] | None = None
    tools: list[str] = Field(default_factory=list)
    handoffs: list[str] = Field(default_factory=list)
    model_settings: dict[str, Any] = Field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    input_schema: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not AGENT_NAME.match(value):
            raise ValueError(
                f"agent name {value!r}: a letter, then letters, digits, '_' or '-', at most 48 characters"
            )
        return value

    @field_validator("handoffs", "tools")
    @classmethod
    def _no_repeats(cls, value: list[str]) -> list[str]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"named twice: {', '.join(repeated)}")
        return value

    @property
    def handoff_tool(self) -> str:
        """The tool another agent hands off to this one with."""
        return build_handoff_tool(self.name)

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of what a parent passes this agent as a sub-agent."""
        return self.input_schema if self.input_schema is not None else DEFAULT_INPUT_SCHEMA


def build_handoff_tool(agent_name: str) -> str:
    """`billing` → `transfer_to_billing`, the tool that hands a turn off to that agent."""
    return f"{HANDOFF_PREFIX}{agent_name}"


class AgentRegistry:
    """The agents a process declares (`agent(...)`), by name; thread-safe."""

    def __init__(self) -> None:
        self._agents: dict[str, AgentSpec] = {}
        self._lock = threading.Lock()

    def add(self, spec: AgentSpec) -> None:
        """Declare `spec`; declaring a name again replaces it (a module reloaded)."""
        with self._lock:
            self._agents[spec.name] = spec

    def specs(self) -> list[AgentSpec]:
        """Every declared agent, by name."""
        with self._lock:
            return [self._agents[name] for name in sorted(self._agents)]

    def clear(self) -> None:
        """Forget every agent (tests)."""
        with self._lock:
            self._agents.clear()


agents = AgentRegistry()
"""The process-wide registry `agent(...)` adds to."""


def agent(
    name: str,
    *,
    instructions: str | None = None,
    description: str = "",
    model: str | list[str] | None = None,
    tools: Iterable[str] = (),
    handoffs: Iterable[str] = (),
    model_settings: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    input_schema: dict[str, Any] | None = None,
    registry: AgentRegistry | None = None,
) -> AgentSpec:
    """Declare a named agent in this module (published by the workers that import it); returns its spec.

    Raises `ToolDefinitionError` (a `ValueError`) for a spec that is not one, at import time, as `@tool` does.
    """
    try:
        spec = AgentSpec(
            name=name,
            description=description,
            instructions=instructions,
            model=model,
            tools=list(tools),
            handoffs=list(handoffs),
            model_settings=dict(model_settings or {}),
            output_schema=output_schema,
            input_schema=input_schema,
        )
    except ValueError as exc:
        raise ToolDefinitionError(f"agent {name!r}: {exc}") from exc
    (registry or agents).add(spec)
    return spec
