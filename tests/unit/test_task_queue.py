"""The script call that writes tool-task messages into the broker's lists (`store.task_queue`)."""

from __future__ import annotations

import pytest

from orchestrator.store import scripts
from orchestrator.store.task_queue import BrokerCommand, is_writable, write_tasks

pytestmark = pytest.mark.timeout(30)


def test_keys_go_to_KEYS_in_order_and_each_command_to_ARGV_as_its_opcode() -> None:
    call = write_tasks(
        [
            BrokerCommand("lpush", ("q1", "m1")),
            BrokerCommand("publish", ("/0.celeryev/task.sent", "e1")),
            BrokerCommand("pexpire", ("q1", "60000")),
            BrokerCommand("lpush", ("q2", "m2")),
        ]
    )
    assert call.script is scripts.WRITE_TASKS
    assert call.keys == ("q1", "q1", "q2")
    assert call.args == ("L", "m1", "P", "/0.celeryev/task.sent", "e1", "E", "60000", "L", "m2")
    assert call.parse(4) == 4


def test_only_the_three_verbs_kombus_publish_batch_uses_are_writable() -> None:
    assert all(is_writable(verb) for verb in ("lpush", "pexpire", "publish"))
    assert not any(is_writable(verb) for verb in ("rpush", "set", "eval", ""))
