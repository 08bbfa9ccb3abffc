"""The turn pages say which agent answered what and which schedule ran a turn, in a real browser on the real
stack: a Redis of the module's own, a prefork worker serving the e2e tools, `toolloop orchestrator` calling
the scripted `plan` model, `toolloop beat`, and `toolloop api` with a token; headless Chromium (Debian's,
driven by Playwright, `tests.support.browser`) signs in with the form.

A planner's page names its agent and lists its child turn (the researcher's: agent, status, a link), whose
page names its own agent and links back to the planner; a triage turn's page says it was handed off to
billing, at the top and in the transcript where it happened; a schedule's run says it is one; a child's
call waiting for a person shows on its parent's page with a link to the child's page, where it is approved.
Agents are registered with `Client.register_agent`; each plan travels in its prompt (`tests.support.plans`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer
from tests.support import served
from tests.support.browser import open_chromium
from tests.support.e2e_processes import OrchestratorHandle
from tests.support.plans import plan_prompt
from tests.support.turns import event_data, wait_outcome
from tests.support.waiting import wait_for, wait_until
from workers import AgentSpec

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOKEN = "agent-pages-token-0c7b"
MODEL = "scripted:plan"
WAIT_MS = 30_000


@pytest.fixture(scope="module", autouse=True)
def running(orchestrator_process: OrchestratorHandle) -> OrchestratorHandle:
    return orchestrator_process


@pytest.fixture(scope="module")
def api_url(module_redis: RedisServer) -> Iterator[str]:
    with served.serving_api(module_redis.url, env={"TOOLLOOP_API_TOKEN": TOKEN}) as base:
        yield base


@pytest.fixture
def page(api_url: str, tmp_path: Path) -> Iterator[Page]:
    """A signed-in page (the sign-in form once, then the session cookie); no script error on it after."""
    with open_chromium(tmp_path / "profile") as browser:
        opened = browser.new_page()
        errors: list[str] = []
        opened.on("pageerror", lambda error: errors.append(str(error)))
        refused = opened.goto(f"{api_url}/ui")
        assert refused is not None and refused.status == 401
        opened.locator("#key").fill(TOKEN)
        with opened.expect_navigation():
            opened.locator("#sign-in button[type=submit]").click()
        yield opened
        assert errors == []


def _name(base: str) -> str:
    return f"{base}-{uuid.uuid4().hex[:6]}"


def _open(page: Page, api_url: str, turn_id: str) -> None:
    page.goto(f"{api_url}/ui/turns/{turn_id}")
    page.locator("#turn-status[data-status=completed]").wait_for(timeout=WAIT_MS)


def test_a_planners_page_lists_its_child_turn_whose_page_links_back(
    page: Page, api_url: str, client: Client, tmp_path: Path
) -> None:
    researcher, planner = _name("researcher"), _name("planner")
    client.register_agent(AgentSpec(name=researcher, model=MODEL, tools=["e2e_add"]))
    client.register_agent(AgentSpec(name=planner, model=MODEL, tools=[researcher]))
    child_plan = plan_prompt(
        [{"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}, {"text": "found 5"}]
    )
    rounds: list[dict[str, Any]] = [
        {"calls": [{"name": researcher, "arguments": {"prompt": child_plan}}]},
        {"text": "planned"},
    ]
    turn_id = client.submit(prompt=plan_prompt(rounds), agent=planner)
    outcome = wait_outcome(client, turn_id)
    (child,) = outcome.children

    _open(page, api_url, turn_id)
    assert page.locator("#turn-agent").inner_text() == f"agent {planner}"
    entry = page.locator(f'#children li[data-child-turn-id="{child.turn_id}"]')
    entry.locator(".status[data-status=completed]").wait_for(timeout=WAIT_MS)
    assert entry.inner_text() == f"{researcher} completed {child.turn_id}"
    assert page.locator("#turn-links").is_hidden()  # nobody's child, no schedule's run
    # The sub-agent's call ran as the child turn: its card links the child's page too.
    card_link = page.locator(f'#transcript .tool[data-call-id="{child.call_id}"] a.child-link')
    assert card_link.get_attribute("href") == f"/ui/turns/{child.turn_id}"
    page.screenshot(path=str(tmp_path / "planner.png"), full_page=True)

    entry.locator("a").click()
    page.wait_for_url(f"{api_url}/ui/turns/{child.turn_id}", timeout=WAIT_MS)
    page.locator("#turn-status[data-status=completed]").wait_for(timeout=WAIT_MS)
    assert page.locator("#turn-agent").inner_text() == f"agent {researcher}"
    links = page.locator("#turn-links")
    links.wait_for(state="visible", timeout=WAIT_MS)
    assert links.inner_text() == f"child turn of {turn_id} (its call {child.call_id})"
    assert page.locator("#children-section").is_hidden()
    links.locator("a").click()
    page.wait_for_url(f"{api_url}/ui/turns/{turn_id}", timeout=WAIT_MS)
    page.locator("#children li").wait_for(timeout=WAIT_MS)


def test_a_handoff_shows_at_the_top_and_in_the_transcript_where_it_happened(
    page: Page, api_url: str, client: Client, tmp_path: Path
) -> None:
    triage, billing = _name("triage"), _name("billing")
    client.register_agent(AgentSpec(name=billing, instructions="You are billing.", model=MODEL))
    client.register_agent(AgentSpec(name=triage, model=MODEL, tools=["e2e_add"], handoffs=[billing]))
    rounds = [{"calls": [{"name": f"transfer_to_{billing}", "arguments": {}}]}, {"text": "billing answered"}]
    turn_id = client.submit(prompt=plan_prompt(rounds), agent=triage)
    assert wait_outcome(client, turn_id).agent == billing

    _open(page, api_url, turn_id)
    top = page.locator("#turn-agent")
    wait_until(lambda: "handed off" in top.inner_text(), "the handoff at the top")
    assert top.inner_text() == f"agent {triage} · handed off to {billing}"
    handoff = page.locator("#transcript .handoff")
    handoff.wait_for(timeout=WAIT_MS)
    assert handoff.inner_text() == f"handed off from {triage} to {billing}"
    # In the first model call's block, the one that asked for the transfer; the answer came after it.
    assert page.locator('#transcript .llm-call[data-llm-call="0"] .handoff').count() == 1
    assert "billing answered" in page.locator('#transcript .llm-call[data-llm-call="1"] .text').inner_text()
    page.screenshot(path=str(tmp_path / "handoff.png"), full_page=True)


def test_a_schedules_run_says_which_schedule_ran_it(
    page: Page, api_url: str, client: Client, module_redis: RedisServer
) -> None:
    name = _name("nightly")
    client.schedule(name, every_s=1, prompt=plan_prompt([{"text": "tick"}]), model=MODEL)
    beat = served.start_toolloop(
        ["beat", "--id", f"beat-{name}", "--lease-ttl-s", "2"], {"TOOLLOOP_REDIS_URL": module_redis.url}
    )
    try:

        def first_run() -> str | None:
            view = next((v for v in client.schedules() if v.schedule.name == name), None)
            return view.state.last_turn_id if view is not None else None

        turn_id = wait_for(first_run, "a run of the schedule", timeout_s=60)
        assert client.unschedule(name)
    finally:
        beat.kill()
    wait_outcome(client, turn_id)

    _open(page, api_url, turn_id)
    links = page.locator("#turn-links")
    links.wait_for(state="visible", timeout=WAIT_MS)
    assert links.inner_text() == f"run of schedule {name}"
    assert page.locator("#turn-agent").is_hidden()  # no agent


def test_a_childs_call_waiting_for_a_person_shows_on_the_parent_and_is_approved_on_the_childs_page(
    page: Page, api_url: str, client: Client, tmp_path: Path
) -> None:
    teller, boss = _name("teller"), _name("boss")
    client.register_agent(AgentSpec(name=teller, model=MODEL, tools=["e2e_transfer"]))
    client.register_agent(AgentSpec(name=boss, model=MODEL, tools=[teller]))
    transfer = [
        {"calls": [{"name": "e2e_transfer", "arguments": {"amount": 5, "to": "pages"}}]},
        {"text": "sent"},
    ]
    rounds = [{"calls": [{"name": teller, "arguments": {"prompt": plan_prompt(transfer)}}]}, {"text": "done"}]
    turn_id = client.submit(prompt=plan_prompt(rounds), agent=boss)
    wait_until(
        lambda: event_data(client.redis, turn_id, "child_call_waiting"), "the child's wait on the parent"
    )
    (shown,) = event_data(client.redis, turn_id, "child_call_waiting")
    child_id = shown["child_turn_id"]

    page.goto(f"{api_url}/ui/turns/{turn_id}")
    wait = page.locator(f'#children li[data-child-turn-id="{child_id}"] .child-wait')
    wait.wait_for(timeout=WAIT_MS)
    assert wait.inner_text() == (
        f"waiting for approval of e2e_transfer ({shown['call_id']}): approve it on the child's page"
    )
    assert page.locator("#waiting-for").inner_text() == f"waiting for the child turn of {teller}"
    page.screenshot(path=str(tmp_path / "child-waiting.png"), full_page=True)
    wait.locator("a").click()
    page.wait_for_url(f"{api_url}/ui/turns/{child_id}", timeout=WAIT_MS)
    card = page.locator(f'.approval[data-call-id="{shown["call_id"]}"]')
    card.wait_for(timeout=WAIT_MS)
    card.locator("button.approve").click()
    page.locator("#turn-status[data-status=completed]").wait_for(timeout=60_000)

    outcome = wait_outcome(client, turn_id)
    assert outcome.status == "completed" and [c.status for c in outcome.children] == ["completed"]
    page.goto(f"{api_url}/ui/turns/{turn_id}")
    entry = page.locator(f'#children li[data-child-turn-id="{child_id}"]')
    entry.locator(".status[data-status=completed]").wait_for(timeout=WAIT_MS)
    page.locator("#turn-status[data-status=completed]").wait_for(timeout=WAIT_MS)
    assert entry.locator(".child-wait").count() == 0  # the wait went with the child's end
