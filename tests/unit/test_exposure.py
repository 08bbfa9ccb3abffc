"""Which bind addresses only this machine reaches, and the one-line refusal to serve elsewhere unauthenticated
(`toolloop api`, `toolloop flower`)."""

from __future__ import annotations

import pytest

from orchestrator.commands.exposure import build_exposure_refusal, is_loopback_host
from orchestrator.commands.flower import build_flower_argv, is_authenticated


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost", "LOCALHOST", "::1", "[::1]"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "api", "example.com", ""])
def test_addresses_others_reach(host: str) -> None:
    assert not is_loopback_host(host)


def refusal(host: str, *, authenticated: bool = False, allowed_open: bool = False) -> str | None:
    return build_exposure_refusal(
        what="the API",
        host=host,
        authenticated=authenticated,
        allowed_open=allowed_open,
        how_to_authenticate="set TOOLLOOP_API_TOKEN",
        opt_out="--allow-no-token",
    )


def test_unauthenticated_on_every_interface_is_refused_in_one_line_that_says_what_to_do() -> None:
    message = refusal("0.0.0.0")
    assert message is not None and "\n" not in message
    assert "0.0.0.0" in message and "TOOLLOOP_API_TOKEN" in message and "--allow-no-token" in message


@pytest.mark.parametrize(
    ("host", "authenticated", "allowed_open"),
    [("0.0.0.0", True, False), ("0.0.0.0", False, True), ("127.0.0.1", False, False)],
)
def test_authenticated_allowed_open_or_loopback_may_start(
    host: str, authenticated: bool, allowed_open: bool
) -> None:
    assert refusal(host, authenticated=authenticated, allowed_open=allowed_open) is None


@pytest.mark.parametrize(
    ("environ", "options", "expected"),
    [
        ({"FLOWER_BASIC_AUTH": "ops:secret"}, [], True),
        ({"FLOWER_AUTH": ".*@example\\.com"}, [], True),
        ({}, ["--basic_auth=ops:secret"], True),
        ({"FLOWER_BASIC_AUTH": ""}, ["--tasks_columns=name,uuid"], False),
        ({}, [], False),
    ],
)
def test_flower_is_authenticated_by_its_variables_or_its_options(
    environ: dict[str, str], options: list[str], expected: bool
) -> None:
    assert is_authenticated(environ, options) is expected


def test_flower_options_are_passed_on_after_ours() -> None:
    argv = build_flower_argv(5555, "0.0.0.0", ["--tasks_columns=name,uuid"])
    assert argv == ["flower", "--port=5555", "--address=0.0.0.0", "--tasks_columns=name,uuid"]
