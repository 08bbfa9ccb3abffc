"""The `toolloop` command's manners: `--version`, shell completion, `submit --no-stream`, and the "did you
mean …?" of a refused tool, through typer's CliRunner (no Redis: the submitting client is a fake)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator import cli
from orchestrator.client import redis_client
from orchestrator.store.flows import check_tool_names
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(30)

runner = CliRunner()


def test_version_prints_the_installed_distributions_version() -> None:
    result = runner.invoke(cli.app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"toolloop {metadata.version('celery-toolloop')}\n"


def test_a_source_tree_without_metadata_reads_its_pyproject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    project = tmp_path / "pyproject.toml"
    project.write_text('[project]\nname = "celery-toolloop"\nversion = "9.8.7"\n', encoding="utf-8")
    assert cli.read_version(project) == "9.8.7+source"
    project.write_text('[project]\nname = "someone-else"\nversion = "1.0"\n', encoding="utf-8")
    assert cli.read_version(project) == "unknown"
    assert cli.read_version(tmp_path / "absent.toml") == "unknown"


def test_shell_completion_is_offered() -> None:
    result = runner.invoke(cli.app, ["--show-completion", "bash"])
    assert result.exit_code == 0, result.output
    assert "_toolloop_completion" in result.stdout
    assert "--install-completion" in runner.invoke(cli.app, ["--help"]).stdout


class FakeClient:
    """What `submit` needs of `Client`: it checks tools against a catalogue serving `add` and `echo`, and
    records what it was asked."""

    submitted: list[dict[str, Any]]
    streamed: list[str]

    def __init__(self, **kwargs: Any) -> None:
        del kwargs

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def submit(self, **request: Any) -> str:
        check_tool_names(request["tools"], {"add": ToolSpec(name="add"), "echo": ToolSpec(name="echo")})
        FakeClient.submitted.append(request)
        return "turn-1"

    def stream(self, turn_id: str) -> Any:
        FakeClient.streamed.append(turn_id)
        return iter(())


@pytest.fixture
def fake_client(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    FakeClient.submitted = []
    FakeClient.streamed = []
    monkeypatch.setattr(redis_client, "Client", FakeClient)
    return FakeClient


@pytest.mark.parametrize("flags", [["--no-stream"], ["--stream", "--no-stream"], []])
def test_submit_no_stream_prints_the_id_without_following(
    fake_client: type[FakeClient], flags: list[str]
) -> None:
    result = runner.invoke(cli.app, ["submit", "--prompt", "2+2?", *flags])
    assert result.exit_code == 0, result.output
    assert result.stdout == "turn-1\n"
    assert len(fake_client.submitted) == 1 and fake_client.streamed == []


def test_submit_stream_follows_the_turn(fake_client: type[FakeClient]) -> None:
    result = runner.invoke(cli.app, ["submit", "--prompt", "2+2?", "--stream"])
    # The fake's stream ends without an outcome: the turn is reported gone (exit 1), after following it.
    assert fake_client.streamed == ["turn-1"]
    assert result.exit_code == 1 and "turn-1" in result.stderr


def test_submit_names_the_closest_tool_to_a_misspelt_one(fake_client: type[FakeClient]) -> None:
    result = runner.invoke(cli.app, ["submit", "--prompt", "2+2?", "--tools", "ad"])
    assert result.exit_code == 2
    assert (
        result.stderr == "error: unknown tool 'ad' (did you mean 'add'?) in 'tools'; available: add, echo\n"
    )
    assert fake_client.submitted == []


def test_flower_without_the_ops_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.commands import flower

    monkeypatch.setattr(flower, "is_flower_installed", lambda: False)
    result = runner.invoke(cli.app, ["flower", "--port", "5599"])
    assert result.exit_code == 2
    assert result.stderr == "error: Flower is not installed here: pip install 'celery-toolloop[ops]'\n"


def test_the_demos_next_steps_say_what_applies_to_this_run() -> None:
    from orchestrator.demo.view import build_next_steps

    stopped = build_next_steps("turn_1", "redis://h:1/0", keep_running=False, flower_installed=True)
    assert "toolloop demo --keep-running" in stopped and "ops extra" not in stopped
    assert "TOOLLOOP_REDIS_URL=redis://h:1/0 toolloop show turn_1" in stopped
    running = build_next_steps("turn_1", "redis://h:1/0", keep_running=True, flower_installed=False)
    assert "--keep-running" not in running and "until Ctrl-C" in running
    assert "Flower comes with the ops extra" in running


@pytest.mark.parametrize("modules", [None, "workers.examples"])
def test_a_worker_serving_the_examples_by_default_says_so(
    modules: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.settings import get_settings

    monkeypatch.delenv("TOOLLOOP_TOOL_MODULES", raising=False)
    if modules is not None:
        monkeypatch.setenv("TOOLLOOP_TOOL_MODULES", modules)
    monkeypatch.setenv("TOOLLOOP_REDIS_URL", "redis://127.0.0.1:1/0")  # refused: the worker never starts
    get_settings.cache_clear()
    try:
        result = runner.invoke(cli.app, ["worker"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 3, result.output
    warned = "warning: TOOLLOOP_TOOL_MODULES is not set: serving the example tools (workers.examples)"
    assert (warned in result.stderr) is (modules is None)


def test_help_paragraphs_wrap_to_the_terminal_not_to_the_source() -> None:
    assert cli.build_help("One line\n    and its rest.\n\nAnother\nparagraph.") == (
        "One line and its rest.\n\nAnother paragraph."
    )
    result = runner.invoke(cli.app, ["submit", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    # A sentence the docstring breaks between two source lines reads whole.
    assert "tool calls, progress and outcomes to stderr, until the turn ends" in text
    lines = [line.strip(" │") for line in result.stdout.splitlines()]
    assert "written, tool calls, progress and" not in lines
