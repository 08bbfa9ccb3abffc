"""Driving a store flow (`orchestrator.store.flows`) by hand: each step it yields is answered as Redis
would, so that a unit test checks what a flow asks for and what it makes of the answers, without Redis.

    steps, result = drive(flows.write_outcome(outcome), [WriteResult.WON])
    steps, result = drive_with(flow, lambda step: answer_for(step))
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any


def drive_with(flow: Generator[Any, Any, Any], answer: Callable[[Any], Any]) -> tuple[list[Any], Any]:
    """Answer each step of `flow` with `answer(step)`: (the steps it yielded, what it returned)."""
    steps: list[Any] = []
    reply: Any = None
    while True:
        try:
            step = flow.send(reply)
        except StopIteration as stop:
            return steps, stop.value
        steps.append(step)
        reply = answer(step)


def drive(flow: Generator[Any, Any, Any], replies: list[Any]) -> tuple[list[Any], Any]:
    """Answer the flow's steps with `replies`, in order; every reply must be used."""
    pending = list(replies)
    steps, result = drive_with(flow, lambda _step: pending.pop(0))
    assert not pending, "the flow ended before using every reply"
    return steps, result
