"""The test helpers signal the process group a test started, and not a group that took its number later."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import process_groups
from tests.support.process_groups import group_alive, pid_exists, signal_group, signal_process
from tests.support.waiting import wait_for, wait_until


def _orphaned_member(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    # A leader that exits at once, leaving a `sleep` in its group: the group outlives its reaped leader.
    pid_file = tmp_path / "member"
    leader = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {pid_file}"], start_new_session=True)
    leader.wait(timeout=10)
    member = wait_for(lambda: int(pid_file.read_text()) if pid_file.read_text().strip() else None, "the pid")
    return leader, member


def member_alive(pid: int) -> bool:
    # `pid_exists` itself is replaced in the test that pretends the leader's number was handed out again.
    return Path(f"/proc/{pid}").exists()


def test_a_reaped_leaders_group_is_still_signalled_while_its_number_is_its_own(tmp_path: Path) -> None:
    leader, member = _orphaned_member(tmp_path)
    assert not pid_exists(leader.pid)  # the kernel keeps a live group's id from every new process
    assert group_alive(leader)
    signal_group(leader, signal.SIGKILL)
    wait_until(lambda: not pid_exists(member), "the group's member to end")
    wait_until(lambda: not group_alive(leader), "the group to be gone")


def test_a_group_id_handed_to_another_process_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, member = _orphaned_member(tmp_path)
    # As when the leader's pid was handed out again: the number is someone else's, whoever is in the group.
    monkeypatch.setattr(process_groups, "pid_exists", lambda pid: True)
    try:
        signal_group(leader, signal.SIGKILL)
        assert not group_alive(leader)
        assert member_alive(member)
    finally:
        monkeypatch.undo()
        signal_group(leader, signal.SIGKILL)


def test_a_reaped_process_is_not_signalled_by_its_old_pid() -> None:
    process = subprocess.Popen(["true"])
    process.wait(timeout=10)
    signal_process(process, signal.SIGKILL)  # no error, and nothing sent: `poll` says it is gone
    running = subprocess.Popen(["sleep", "60"])
    signal_process(running, signal.SIGKILL)
    assert running.wait(timeout=10) == -signal.SIGKILL
