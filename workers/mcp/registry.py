"""Celery's task registry for toolloop apps, which can resolve a tool task it has no entry for yet.

A pool process is a fork of the worker's main process: it has the tasks the main process had then. An MCP
server may list a tool later (it was down at the start, or its list changed); the main process registers
its task, but a pool process forked before would fail the call as "not registered" before any toolloop code
runs. Instead, the lookup of a name it lacks asks the resolvers (`workers.mcp.serving` adds one in each pool
process), which build the task from the server's entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task
from celery.app.registry import TaskRegistry

TaskResolver = Callable[[str], "Task[Any, Any] | None"]
_resolvers: list[TaskResolver] = []


def add_task_resolver(resolver: TaskResolver) -> None:
    """Ask `resolver(name)` (a task, or None) for the tasks this process's registries lack."""
    _resolvers.append(resolver)


class ToolTaskRegistry(TaskRegistry):
    """A `TaskRegistry` whose missing names go to the resolvers before Celery's `NotRegistered`."""

    def __missing__(self, key: str) -> Task[Any, Any]:
        for resolve in list(_resolvers):
            task = resolve(key)
            if task is not None:
                return task
        return super().__missing__(key)
