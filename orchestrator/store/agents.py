"""The named agents in Redis (`keys.AGENTS`, name → `workers.agents.AgentSpec` JSON), as store operations.

Workers publish the agents their modules declare with their catalogue; the clients register others
(`Client.register_agent`). An entry that does not parse (another release wrote it) is skipped and logged
once per process: the other agents stay usable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import ValidationError

from orchestrator.store.effects import RedisCommand
from workers import keys
from workers.agents import AgentSpec

logger = logging.getLogger(__name__)

_told: set[str] = set()


def build_agents(entries: Mapping[bytes | str, bytes | str]) -> dict[str, AgentSpec]:
    """The agents of the raw hash, by name; malformed entries skipped."""
    found: dict[str, AgentSpec] = {}
    for raw_name, raw in entries.items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        try:
            spec = AgentSpec.model_validate_json(raw)
        except ValidationError as exc:
            if name not in _told:
                _told.add(name)
                logger.warning("agent %r in Redis does not parse (skipped): %s", name, exc.errors()[:1])
            continue
        if spec.name == name:
            found[name] = spec
    return dict(sorted(found.items()))


def get_agents() -> RedisCommand[dict[str, AgentSpec]]:
    """The operation that reads every agent."""
    return RedisCommand(("HGETALL", keys.AGENTS), build_agents)


def put_agent(spec: AgentSpec) -> RedisCommand[int]:
    """The operation that registers (or replaces) an agent."""
    return RedisCommand(("HSET", keys.AGENTS, spec.name, spec.model_dump_json(exclude_defaults=True)), int)


def delete_agent(name: str) -> RedisCommand[bool]:
    """The operation that removes an agent; True when there was one."""
    return RedisCommand(("HDEL", keys.AGENTS, name), lambda removed: bool(int(removed)))
