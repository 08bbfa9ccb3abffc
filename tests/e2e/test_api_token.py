"""`toolloop api` bound to an address other machines reach refuses to start without a token, in one line,
unless told explicitly to serve it open (`--allow-no-token`, `TOOLLOOP_API_ALLOW_NO_TOKEN=1`); a blank
`TOOLLOOP_API_TOKEN` (what compose passes when the variable is unset) is no token. On loopback, the
development default, it starts without one as before. `toolloop flower` has the same rule for basic auth.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from orchestrator.redis_server import find_free_port
from tests.support.served import Served, answers, start_toolloop

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# Every address of this machine: the non-loopback bind a container uses.
ALL_INTERFACES = "0.0.0.0"


@pytest.fixture
def started() -> Iterator[list[Served]]:
    """Every process a test starts, killed at teardown whatever happened."""
    processes: list[Served] = []
    yield processes
    for served in processes:
        served.kill()


def run_api(started: list[Served], redis_url: str, host: str, env: dict[str, str], *flags: str) -> str:
    """Start `toolloop api` and return its base URL once it answers."""
    port = find_free_port()
    served = start_toolloop(
        ["api", "--host", host, "--port", str(port), *flags], env={"TOOLLOOP_REDIS_URL": redis_url, **env}
    )
    started.append(served)
    base = f"http://127.0.0.1:{port}"
    served.wait_for(lambda: answers(f"{base}/healthz"), "the API to answer")
    return base


def refusal(started: list[Served], args: list[str], env: dict[str, str]) -> str:
    """Run a command that must refuse to start: exit 2 at once, one line on stderr, nothing listening."""
    served = start_toolloop(args, env=env)
    started.append(served)
    code = served.process.wait(timeout=10)
    text = served.log_text()
    assert code == 2, text
    assert text.count("\n") == 1 and text.startswith("error: refusing to serve"), text
    return text


@pytest.mark.parametrize("token_env", [{}, {"TOOLLOOP_API_TOKEN": ""}, {"TOOLLOOP_API_TOKEN": "  "}])
def test_the_api_on_all_interfaces_refuses_to_start_without_a_token(
    started: list[Served], redis_url: str, token_env: dict[str, str]
) -> None:
    port = find_free_port()
    text = refusal(
        started,
        ["api", "--host", ALL_INTERFACES, "--port", str(port)],
        {"TOOLLOOP_REDIS_URL": redis_url, "TOOLLOOP_API_ALLOW_NO_TOKEN": "", **token_env},
    )
    assert ALL_INTERFACES in text and "TOOLLOOP_API_TOKEN" in text
    assert "--allow-no-token" in text and "TOOLLOOP_API_ALLOW_NO_TOKEN=1" in text
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)


@pytest.mark.parametrize(
    ("env", "flags"),
    [({"TOOLLOOP_API_ALLOW_NO_TOKEN": "1"}, ()), ({}, ("--allow-no-token",))],
    ids=["variable", "flag"],
)
def test_the_api_serves_open_when_told_to(
    started: list[Served], redis_url: str, env: dict[str, str], flags: tuple[str, ...]
) -> None:
    # Compose passes a blank token when none is set: served open, that blank is no token at all.
    base = run_api(started, redis_url, ALL_INTERFACES, {"TOOLLOOP_API_TOKEN": "", **env}, *flags)
    assert httpx.get(f"{base}/v1/tools", timeout=5).status_code == 200


def test_the_api_on_all_interfaces_with_a_token_requires_it(started: list[Served], redis_url: str) -> None:
    base = run_api(started, redis_url, ALL_INTERFACES, {"TOOLLOOP_API_TOKEN": "s3cret-token"})
    assert httpx.get(f"{base}/v1/tools", timeout=5).status_code == 401
    authorized = {"Authorization": "Bearer s3cret-token"}
    assert httpx.get(f"{base}/v1/tools", headers=authorized, timeout=5).status_code == 200


def test_the_api_on_loopback_starts_without_a_token(started: list[Served], redis_url: str) -> None:
    base = run_api(started, redis_url, "127.0.0.1", {"TOOLLOOP_API_TOKEN": ""})
    assert httpx.get(f"{base}/v1/tools", timeout=5).status_code == 200


def test_flower_on_all_interfaces_refuses_to_start_without_basic_auth(
    started: list[Served], redis_url: str
) -> None:
    text = refusal(
        started,
        ["flower", "--address", ALL_INTERFACES, "--port", str(find_free_port())],
        {"TOOLLOOP_REDIS_URL": redis_url, "FLOWER_BASIC_AUTH": "", "FLOWER_AUTH": ""},
    )
    assert "FLOWER_BASIC_AUTH" in text and "--allow-no-auth" in text
