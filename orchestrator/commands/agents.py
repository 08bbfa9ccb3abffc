"""`toolloop agents`: the named agents turns may run as (from Redis: the workers' modules declare them,
the clients register others).

Exit codes: 0 ok; 3 Redis is unreachable. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
from typing import Annotated

import redis
import typer

from orchestrator.commands.exits import EXIT_REDIS, fail
from orchestrator.settings import get_settings
from orchestrator.store.agents import get_agents
from orchestrator.store.connection import build_shown_url
from orchestrator.store.runner import SyncRunner
from workers.agents import AgentSpec
from workers.connect import connect_redis


def agents_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print the specs as JSON.")] = False,
) -> None:
    """List the named agents: what each calls (tools and sub-agents), hands off to, and runs on."""
    settings = get_settings()
    url = settings.redis_url
    try:
        client = connect_redis(url, settings.redis_ssl_cert_reqs, socket_connect_timeout=3)
        agents = SyncRunner(client).run(get_agents())
    except redis.RedisError as exc:
        fail(f"cannot reach Redis at {build_shown_url(url)}: {exc} (set TOOLLOOP_REDIS_URL)", EXIT_REDIS)
    if as_json:
        dumped = [spec.model_dump(mode="json", exclude_defaults=True) for spec in agents.values()]
        typer.echo(json.dumps(dumped, indent=2, ensure_ascii=False))
        return
    from rich.console import Console
    from rich.table import Column, Table

    widths = [len(name) for name in agents] or [5]
    table = Table(
        Column("agent", no_wrap=True, min_width=max(widths)), "description", "tools", "handoffs", "model"
    )
    for spec in agents.values():
        table.add_row(
            spec.name, _first_line(spec), ", ".join(spec.tools), ", ".join(spec.handoffs), _model(spec)
        )
    Console().print(
        table if agents else "no agents: declare one in a tool module (from workers import agent)"
    )


def _first_line(spec: AgentSpec) -> str:
    return (spec.description or spec.instructions or "").split("\n", 1)[0]


def _model(spec: AgentSpec) -> str:
    if isinstance(spec.model, list):
        return " → ".join(spec.model)
    return spec.model or "(the orchestrator's default)"
