"""`toolloop redis` in the foreground: serves, and takes its redis-server down with it when stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from orchestrator.errors import RedisServerError
from orchestrator.redis_server import RedisServer, find_free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

TOOLLOOP_BIN = Path(sys.executable).parent / "toolloop"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_stopping_toolloop_redis_stops_its_server(stop_signal: signal.Signals, tmp_path: Path) -> None:
    port = find_free_port()
    process = subprocess.Popen(
        [str(TOOLLOOP_BIN), "redis", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=tmp_path,  # its append-only file goes to ./.toolloop/redis
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        match = re.search(r"pid (\d+)", banner)
        assert match, banner
        server_pid = int(match.group(1))
        client = redis.Redis(port=port)
        assert client.ping()
        client.close()

        os.kill(process.pid, stop_signal)
        assert process.wait(timeout=15) == 0
        # The wrapper must not leave its redis-server running (waitpid'd by the wrapper, so no zombie).
        assert not _alive(server_pid), f"redis-server {server_pid} outlived `toolloop redis`"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_a_port_taken_before_redis_binds_it_is_replaced_by_another() -> None:
    """find_free_port's port can be taken before redis-server binds it: the server must not adopt a
    stranger that answers PING there, but move to another port."""
    with RedisServer() as stranger:
        ours = RedisServer()
        ours.port = stranger.port  # the race: our chosen port was bound by someone else meanwhile
        with ours:
            assert ours.port != stranger.port
            client = redis.Redis(port=ours.port)
            assert int(client.info("server")["process_id"]) == ours.pid
            client.close()


def test_a_fixed_port_served_by_another_redis_is_an_error() -> None:
    with RedisServer() as stranger:
        with pytest.raises(RedisServerError, match=str(stranger.port)):
            RedisServer(port=stranger.port).start()
        # The stranger is untouched.
        client = redis.Redis(port=stranger.port)
        assert client.ping()
        client.close()


def _start_toolloop_redis(cwd: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`toolloop redis ARGS` in `cwd`, and its banner once it serves."""
    process = subprocess.Popen(
        [str(TOOLLOOP_BIN), "redis", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=cwd,
    )
    assert process.stdout is not None
    return process, process.stdout.readline()


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=15)
    if process.stdout is not None:
        process.stdout.close()


def test_toolloop_redis_persists_by_default_and_comes_back_with_its_data(tmp_path: Path) -> None:
    port = find_free_port()
    process, banner = _start_toolloop_redis(tmp_path, "--port", str(port))
    try:
        assert "append-only file in" in banner and "appendfsync everysec" in banner, banner
        client = redis.Redis(port=port)
        client.set("toolloop:test:kept", "yes")
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
    finally:
        _stop(process)
    assert (tmp_path / ".toolloop" / "redis").is_dir()
    # Made in the folder it runs in, often an app's checkout: git is told to leave the data alone.
    assert (tmp_path / ".toolloop" / ".gitignore").read_text().splitlines()[-1] == "*"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert ".toolloop" not in listed, listed

    process, banner = _start_toolloop_redis(tmp_path, "--port", str(port))
    try:
        client = redis.Redis(port=port)
        assert client.get("toolloop:test:kept") == b"yes"
        client.close()
    finally:
        _stop(process)


def test_two_toolloop_redis_never_share_a_data_dir(tmp_path: Path) -> None:
    first, _ = _start_toolloop_redis(tmp_path, "--port", str(find_free_port()), "--dir", "data")
    try:
        second = subprocess.run(
            [str(TOOLLOOP_BIN), "redis", "--port", str(find_free_port()), "--dir", "data"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=20,
            check=False,
        )
        assert second.returncode == 3
        assert "another `toolloop redis` uses" in second.stderr and "--dir" in second.stderr
    finally:
        _stop(first)


def test_toolloop_redis_without_persistence_says_so_and_leaves_no_data_dir(tmp_path: Path) -> None:
    process, banner = _start_toolloop_redis(tmp_path, "--no-appendonly")
    try:
        assert "no persistence" in banner, banner
    finally:
        _stop(process)
    assert not (tmp_path / ".toolloop" / "redis").exists()
