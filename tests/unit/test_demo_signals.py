"""The demo records every child it starts before an interrupt can end it (`_interrupts_held`).

Ctrl-C that came between a child's start and its record left that child running, unknown to the cleanup (an
API process outlived an interrupted demo in a suite run). The interrupt now waits until the record is made.
"""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.demo.run import _interruptible, _interrupts_held


def test_an_interrupt_while_a_child_is_recorded_is_raised_once_it_is() -> None:
    recorded: list[str] = []
    with _interruptible(), pytest.raises(KeyboardInterrupt), _interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, and holds it
        recorded.append("child")
    assert recorded == ["child"]


def test_outside_a_start_an_interrupt_is_raised_at_once() -> None:
    reached: list[str] = []
    with _interruptible(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append("after")
    assert reached == []
