"""A turn that runs as a named agent, resolved: pure functions from the agents in Redis (`workers.agents`) and
the tool catalogue to what the machine runs (`machine.state.AgentRun`).

    resolve_agent      the request as its agent runs it: the agent's instructions, model, tools, settings and
                       output schema, for each of those the request does not set itself
    build_agent_runs   the run of the turn's agent and of every agent a handoff may reach: the tools each
                       offers (catalogue tools, sub-agents as tools, `transfer_to_<agent>` for handoffs)
    build_child_request  a sub-agent call's child turn: the agent, its input, and the parent's link, time and
                       budgets
    build_child_report what a child tells its parent when it ends

Unknown agents are refused by name (`UnknownAgentError`, with the closest known name), at submit and here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.errors import UnknownAgentError
from orchestrator.machine.events import StartChildTurn
from orchestrator.machine.state import AgentRun
from orchestrator.machine.validation import offered_tools
from orchestrator.model import ChildReport, Limits, ModelSettings, ParentLink, TurnOutcome, TurnRequest
from workers.agents import AgentSpec, build_handoff_tool
from workers.contract import ToolSpec

ModelResolver = Callable[[str | list[str] | None], list[str]]
"""How the orchestrator resolves a model name, tier or fallback list to `provider:model`s."""


def require_agent(name: str, agents: Mapping[str, AgentSpec]) -> AgentSpec:
    """The agent `name`; `UnknownAgentError` (a `ValueError`) naming the known ones when there is none."""
    spec = agents.get(name)
    if spec is None:
        raise UnknownAgentError(name, agents)
    return spec


def resolve_agent(request: TurnRequest, agents: Mapping[str, AgentSpec]) -> TurnRequest:
    """`request` as its agent runs it: each of instructions, model, tools and output schema the request
    leaves unset comes from the agent, and the agent's model settings are the base the request's own
    settings override field by field."""
    if request.agent is None:
        return request
    spec = require_agent(request.agent, agents)
    settings = {**spec.model_settings, **request.model_settings.model_dump(exclude_unset=True)}
    return request.model_copy(
        update={
            "instructions": request.instructions if request.instructions is not None else spec.instructions,
            "model": request.model if request.model is not None else spec.model,
            "tools": request.tools if request.tools is not None else list(spec.tools),
            "model_settings": ModelSettings.model_validate(settings),
            "output_schema": request.output_schema
            if request.output_schema is not None
            else spec.output_schema,
        }
    )


def build_sub_agent_tool(spec: AgentSpec) -> ToolSpec:
    """A sub-agent as the tool its parent's model calls: its description, its input (default: a prompt)."""
    description = spec.description or f"Ask the {spec.name} agent to do a task and answer with its result."
    return ToolSpec(name=spec.name, description=description, parameters=spec.parameters)


def build_handoff_spec(spec: AgentSpec) -> ToolSpec:
    """A handoff as the tool the model calls to hand the conversation over to `spec`'s agent."""
    about = f": {spec.description}" if spec.description else ""
    description = f"Hand the conversation over to the {spec.name} agent{about}. It answers from then on."
    name = build_handoff_tool(spec.name)
    return ToolSpec(name=name, description=description, parameters={"type": "object", "properties": {}})


def _run_of(
    name: str,
    *,
    instructions: str | None,
    models: list[str],
    settings: ModelSettings,
    output_schema: dict[str, Any] | None,
    tools: Sequence[str] | None,
    handoffs: Sequence[str],
    agents: Mapping[str, AgentSpec],
    catalogue: Mapping[str, ToolSpec],
) -> AgentRun:
    named = list(tools) if tools is not None else None
    sub_agents = [tool for tool in named or () if tool in agents and tool not in catalogue]
    offered = offered_tools(catalogue, None if named is None else [t for t in named if t not in sub_agents])
    offered.update({tool: build_sub_agent_tool(agents[tool]) for tool in sub_agents})
    handoff_tools = {build_handoff_tool(target): target for target in handoffs if target in agents}
    offered.update({tool: build_handoff_spec(agents[target]) for tool, target in handoff_tools.items()})
    return AgentRun(
        name=name,
        instructions=instructions,
        models=models,
        model_settings=settings,
        output_schema=output_schema,
        offered=offered,
        sub_agents=sub_agents,
        handoffs=handoff_tools,
    )


def build_agent_runs(
    request: TurnRequest,
    agents: Mapping[str, AgentSpec],
    catalogue: Mapping[str, ToolSpec],
    models: list[str],
    resolve_models: ModelResolver,
) -> dict[str, AgentRun]:
    """The run of the turn's agent (`request` already resolved: `resolve_agent`, its `models` resolved) and of
    every agent its handoffs reach, transitively, each with its own instructions, models and tools."""
    if request.agent is None:
        return {}
    start = require_agent(request.agent, agents)
    runs = {
        start.name: _run_of(
            start.name,
            instructions=request.instructions,
            models=models,
            settings=request.model_settings,
            output_schema=request.output_schema,
            tools=request.tools,
            handoffs=start.handoffs,
            agents=agents,
            catalogue=catalogue,
        )
    }
    pending = [target for target in start.handoffs if target in agents]
    while pending:
        name = pending.pop()
        if name in runs:
            continue
        spec = agents[name]
        runs[name] = _run_of(
            name,
            instructions=spec.instructions,
            models=resolve_models(spec.model),
            settings=ModelSettings.model_validate(spec.model_settings),
            output_schema=spec.output_schema,
            tools=spec.tools,
            handoffs=spec.handoffs,
            agents=agents,
            catalogue=catalogue,
        )
        pending += [target for target in spec.handoffs if target in agents and target not in runs]
    return runs


def build_child_prompt(arguments: Mapping[str, object]) -> str:
    """A sub-agent's input as its child turn's prompt: the `prompt` it was given alone (the default input),
    else (an input the agent declares) the arguments as JSON."""
    prompt = arguments.get("prompt")
    if isinstance(prompt, str) and prompt.strip() and set(arguments) == {"prompt"}:
        return prompt
    return json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True)


def build_child_request(
    command: StartChildTurn, parent_turn_id: str, max_agent_depth: int, stream: bool, now: float
) -> TurnRequest:
    """The child turn a sub-agent call starts: as the agent, with the call's input, linked to its parent,
    ending by the parent's deadline and within the parent's budgets; its tenant and lane are the parent's."""
    return TurnRequest(
        agent=command.agent,
        prompt=build_child_prompt(command.arguments),
        parent=ParentLink(turn_id=parent_turn_id, call_id=command.call_id, depth=command.depth),
        limits=Limits(
            deadline_s=max(command.deadline_at - now, 1.0),
            max_total_tokens=command.max_total_tokens,
            max_cost_usd=command.max_cost_usd,
            max_agent_depth=max_agent_depth,
        ),
        tenant=command.tenant,
        priority=command.priority,
        stream=stream,
    )


def build_child_report(outcome: TurnOutcome) -> ChildReport:
    """What a child turn tells its parent when it ends: a completed one its typed output (or final text), any
    other its status and why, as the error the parent's model reads; its usage either way."""
    if outcome.status == "completed":
        result = outcome.output if outcome.output is not None else (outcome.text or "")
        return ChildReport(turn_id=outcome.turn_id, status=outcome.status, result=result, usage=outcome.usage)
    why = outcome.text or outcome.stop_reason or outcome.status
    error = f"the sub-agent's turn {outcome.status}: {why}"
    return ChildReport(turn_id=outcome.turn_id, status=outcome.status, error=error, usage=outcome.usage)
