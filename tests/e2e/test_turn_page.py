"""The turn page in a real browser, on the real stack (issue 14): a Redis, a prefork worker, `toolloop
orchestrator` whose scripted model writes its answer slowly (TOOLLOOP_SCRIPTED_STREAM_DELAY_S), and `toolloop
api` with a token. Headless Chromium (Debian's, driven by Playwright, `tests.support.browser`) signs in with
the form and opens `/ui/turns/{id}` while the turn runs; it must see the answer grow while the turn is still
running, then the tool call finished with its outcome kind, its progress and its Flower link, then the final
status; the answer on the page is the outcome's text exactly, and no secret (the API token, a sensitive
argument) appears on it. Conditions are waited for, never timed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support import served
from tests.support.browser import open_chromium
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.turns import event_data
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOKEN = "page-test-token-4f1c"
APPROVER_KEY = "page-approver-key-83d0"
SECRET = "sk-page-secret-9d2e"
FLOWER = "http://flower.test:5555"
# Between two chunks of a streamed answer (about a word each): the answer below takes seconds to write.
STREAM_DELAY_S = "0.08"
ANSWER = " ".join(f"word{n} of the answer <b>bold</b> & more;" for n in range(15))
TERMINAL = ("completed", "stopped", "failed", "cancelled")


@pytest.fixture(scope="module")
def page_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    tools = ["tests.support.progress_tools", "tests.support.e2e_tools"]
    handle = start_worker(module_redis.url, tools, concurrency=1)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def slow_orchestrator(module_redis: RedisServer, page_worker: WorkerHandle) -> Iterator[OrchestratorHandle]:
    # No TOOLLOOP_SCRIPTED_BASE_URL: the orchestrator serves the scripted model itself, paced by the delay.
    env = {"TOOLLOOP_SCRIPTED_STREAM_DELAY_S": STREAM_DELAY_S, "TOOLLOOP_METRICS_PORT": str(find_free_port())}
    handle = start_orchestrator(module_redis.url, env=env)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def api_url(module_redis: RedisServer) -> Iterator[str]:
    keys = {APPROVER_KEY: {"tenant": "default", "scopes": ["read", "approve"], "name": "ana"}}
    env = {"TOOLLOOP_API_TOKEN": TOKEN, "TOOLLOOP_FLOWER_URL": FLOWER, "TOOLLOOP_API_KEYS": json.dumps(keys)}
    with served.serving_api(module_redis.url, env=env) as base:
        yield base


def sign_in(page: Page, url: str, key: str = TOKEN) -> None:
    """Open `url`, answered by the sign-in form, and sign in there with `key` (never in an address)."""
    refused = page.goto(url)
    assert refused is not None and refused.status == 401
    page.locator("#key").fill(key)
    with page.expect_navigation():
        page.locator("#sign-in button[type=submit]").click()
    assert page.url == url and key not in page.url


def answer_text(page: Page) -> str:
    """The text the page shows for the turn's last model call (its answer, as it is written)."""
    texts = page.locator("#transcript .llm-call .text")
    count = texts.count()
    return (texts.nth(count - 1).text_content() or "") if count else ""


def turn_status(page: Page) -> str:
    return page.locator("#turn-status").get_attribute("data-status") or ""


def submit_turn(client: Client) -> str:
    plan = [
        {"calls": [{"name": "progress_steps", "arguments": {"api_key": SECRET, "steps": 3, "pause_s": 0.5}}]},
        {"text": ANSWER},
    ]
    return client.submit(prompt=json.dumps({"plan": plan}), model="scripted:plan", tools=["progress_steps"])


def test_the_turn_page_shows_the_answer_growing_and_the_tool_call_finishing(
    module_redis: RedisServer, slow_orchestrator: OrchestratorHandle, api_url: str, tmp_path: Path
) -> None:
    client = Client(module_redis.url)
    try:
        with open_chromium(tmp_path / "profile") as browser:
            page = browser.new_page()
            turn_id = submit_turn(client)  # once the browser is up, so that the page opens while it runs
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            # The sign-in form once: it POSTs the token, and the page comes back with a session cookie.
            sign_in(page, f"{api_url}/ui/turns/{turn_id}")
            assert turn_status(page) not in TERMINAL, "the page must be open while the turn runs"

            # The answer grows: seen at two moments, the second longer, while the turn still runs (the status
            # is read after the text, so a running status means the text was read before the end). The page
            # runs under a CSP without eval, where Playwright's wait_for_function cannot run: it is read
            # through locators, polled.
            wait_until(lambda: answer_text(page) != "" and turn_status(page) == "running", "a first piece")
            first = answer_text(page)
            assert turn_status(page) == "running", (
                f"finished before the page showed it being written: {first!r}"
            )

            def grown() -> bool:
                text = answer_text(page)
                status = turn_status(page)
                assert status == "running" or len(text) > len(first), "the turn ended before the text grew"
                return len(text) > len(first) and status == "running"

            wait_until(grown, "the answer to grow while the turn runs")
            second = answer_text(page)
            assert second.startswith(first) and len(second) > len(first)
            page.screenshot(path=str(tmp_path / "turn-running.png"), full_page=True)

            page.locator("#turn-status[data-status=completed]").wait_for(timeout=90_000)
            outcome = client.outcome(turn_id)
            assert outcome is not None and outcome.status == "completed"
            assert answer_text(page) == outcome.text == ANSWER  # the deltas add up to the text, shown as text

            card = page.locator(".tool[data-status=finished]")
            assert card.count() == 1
            assert card.get_attribute("data-outcome") == "ok"
            assert card.locator(".name").inner_text() == "progress_steps"
            assert card.locator(".outcome").inner_text() == "ok"
            assert card.locator(".worker").inner_text().startswith("on ")
            assert card.locator(".duration").inner_text().endswith("s")
            assert "step" in card.locator(".progress").inner_text()
            task_id = dispatched_task_id(client, turn_id)
            assert card.locator("a.flower").get_attribute("href") == f"{FLOWER}/task/{task_id}"
            assert '"api_key": "***"' in (card.locator(".arguments pre").text_content() or "")
            # The timeline, above the transcript: a bar per model call and one for the tool call, its time in
            # the queue shaded on it.
            timeline = page.locator("#timeline svg")
            assert timeline.is_visible()
            bars = page.locator("#timeline rect.tl-bar")
            assert bars.and_(page.locator("[data-kind=model]")).count() == outcome.llm_calls == 2
            assert bars.and_(page.locator("[data-kind=tool]")).count() == 1
            assert page.locator("#timeline rect.tl-wait[data-why=queue]").count() == 1
            assert "progress_steps" in (timeline.text_content() or "")
            above = page.locator("#timeline-section").bounding_box()
            below = page.locator("#transcript").bounding_box()
            assert above is not None and below is not None and above["y"] < below["y"]
            page.screenshot(path=str(tmp_path / "turn-finished.png"), full_page=True)
            # The prompt is the user's own text (this one spells the tool's arguments): anything else shown
            # comes from events, where a sensitive argument is redacted, in arguments and in progress alike.
            shown = page.locator("#transcript").inner_html() + page.locator("#event-log").inner_html()
            assert SECRET not in shown and SECRET in page.locator("#prompt").inner_text()
            shown = page.content()

            # Opened after the end, the page replays the stream and shows the same.
            page.goto(f"{api_url}/ui/turns/{turn_id}")
            page.locator("#turn-status[data-status=completed]").wait_for(timeout=30_000)
            assert answer_text(page) == ANSWER
            assert page.locator(".tool[data-status=finished][data-outcome=ok]").count() == 1
            shown += page.content()

            page.goto(f"{api_url}/ui")
            row = page.locator(f'tr[data-turn-id="{turn_id}"]')
            row.wait_for(timeout=30_000)
            assert "completed" in row.inner_text() and "progress_steps" in row.inner_text()
            shown += page.content()
            assert errors == []
        assert TOKEN not in shown
    finally:
        client.redis.close()


def test_a_failed_calls_card_says_why(
    module_redis: RedisServer, slow_orchestrator: OrchestratorHandle, api_url: str, tmp_path: Path
) -> None:
    client = Client(module_redis.url)
    try:
        plan = [{"calls": [{"name": "e2e_add", "arguments": {"a": "three", "b": 1}}]}, {"text": "no sum"}]
        turn_id = client.submit(prompt=json.dumps({"plan": plan}), model="scripted:plan", tools=["e2e_add"])
        wait_until(lambda: client.outcome(turn_id) is not None, "the turn to end")
        ended = [
            *event_data(client.redis, turn_id, "tool_finished"),
            *event_data(client.redis, turn_id, "tool_synthesized"),
        ]
        (finished,) = ended
        assert not finished["ok"] and finished["error"]
        with open_chromium(tmp_path / "profile") as browser:
            page = browser.new_page()
            sign_in(page, f"{api_url}/ui/turns/{turn_id}")
            card = page.locator(f'.tool[data-call-id="{finished["call_id"]}"]')
            card.locator(".error").wait_for(timeout=30_000)
            assert card.get_attribute("data-outcome") == finished["failure_kind"]
            assert card.locator(".error").inner_text() == finished["error"]
    finally:
        client.redis.close()


def dispatched_task_id(client: Client, turn_id: str) -> str:
    """The Celery task id of the turn's one tool call, from its `tool_dispatched` event."""
    (dispatched,) = event_data(client.redis, turn_id, "tool_dispatched")
    return str(dispatched["task_id"])


def test_the_approve_button_approves_a_waiting_call_with_edited_arguments_and_the_turn_completes(
    module_redis: RedisServer, slow_orchestrator: OrchestratorHandle, api_url: str, tmp_path: Path
) -> None:
    client = Client(module_redis.url)
    plan = [
        {"calls": [{"name": "e2e_transfer", "arguments": {"amount": 50, "to": "page-bob"}}]},
        {"text": "sent"},
    ]
    try:
        with open_chromium(tmp_path / "profile") as browser:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            turn_id = client.submit(
                prompt=json.dumps({"plan": plan}), model="scripted:plan", tools=["e2e_transfer"]
            )
            sign_in(page, f"{api_url}/ui/turns/{turn_id}", APPROVER_KEY)

            card = page.locator(".approval[data-state=waiting]")
            card.wait_for(timeout=60_000)
            (waiting,) = client.get(turn_id).pending_approvals
            assert page.locator("#waiting-for").inner_text() == "waiting for approval of e2e_transfer"
            assert card.get_attribute("data-call-id") == waiting.call_id
            assert card.locator(".call-id").inner_text() == waiting.call_id
            assert json.loads(card.locator("textarea.arguments").input_value()) == {
                "amount": 50,
                "to": "page-bob",
            }
            wait_until(lambda: card.locator(".waited").inner_text().startswith("waiting "), "the wait shown")

            # The listing puts the waiting turn first, before a newer one, and filters by status.
            newer = client.submit(prompt="hello", model="scripted:echo")
            listing = browser.new_page()
            listing.goto(f"{api_url}/ui")
            listing.locator(f'tr[data-turn-id="{newer}"]').wait_for(timeout=30_000)
            rows = listing.locator("#turns tbody tr")
            assert rows.first.get_attribute("data-turn-id") == turn_id
            assert rows.first.get_attribute("data-status") == "waiting"
            listing.goto(f"{api_url}/ui?status=waiting")
            listing.locator(f'tr[data-turn-id="{turn_id}"]').wait_for(timeout=30_000)
            assert listing.locator(f'tr[data-turn-id="{newer}"]').count() == 0
            assert listing.locator("#filter-status").input_value() == "waiting"
            listing.close()

            # What is not a JSON object is refused on the page, before anything is sent.
            card.locator("textarea.arguments").fill("{not json")
            card.locator("button.approve").click()
            assert "not JSON" in card.locator(".error").inner_text()
            assert client.get(turn_id).status == "waiting"

            card.locator("textarea.arguments").fill(json.dumps({"amount": 20, "to": "page-bob"}))
            card.locator("input.message").fill("smaller, as agreed")
            card.locator("button.approve").click()
            page.locator("#turn-status[data-status=completed]").wait_for(timeout=60_000)
            assert page.locator("#approvals-section").is_hidden()
            # Who decided, and why, stays on the call's card.
            decided = page.locator(".tool .decision")
            assert decided.inner_text() == "approved by default/ana: smaller, as agreed"
            # The wait for the person is shaded on the call's bar.
            assert page.locator("#timeline rect.tl-wait[data-why=approval]").count() == 1
            page.screenshot(path=str(tmp_path / "turn-approved.png"), full_page=True)
            assert errors == []
        outcome = client.outcome(turn_id)
        assert outcome is not None and outcome.status == "completed"
        (decision,) = outcome.approvals
        assert decision.approved and decision.edited and decision.reason == "smaller, as agreed"
        assert decision.decided_by == "default/ana"  # the key's tenant and name, not what a page could claim
        (finished,) = event_data(client.redis, turn_id, "tool_finished")
        assert finished["ok"] is True
    finally:
        client.redis.close()
