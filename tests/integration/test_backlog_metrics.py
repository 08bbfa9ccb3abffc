"""The backlog gauges of the API's `/metrics` (`orchestrator.store.backlog`), on the shipped processes.

`toolloop api` with keys of two tenants, `toolloop orchestrator` and `toolloop worker` on a Redis of their own
(`FaultEnv`). A worker serves the fault tool once, so the tool is known, and stops:

- turns submitted with no orchestrator are `toolloop_turns_queued` of their tenant ("other" for one no key
  names), and none running;
- an orchestrator takes them: each is `toolloop_turns_running`, and its call waits in `tool.fault_work` with
  no worker: the queue's length is the calls', and its oldest age grows as the scrapes go on;
- a worker starts: the queue drains (length 0, age 0) and the turns end (nothing queued or running);
- a call in a `TOOLLOOP_MODEL_LIMITS` budget's line is `toolloop_model_calls_waiting` of its entry.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.store.catalogue import read_catalogue
from tests.faults.env import PLAN_MODEL, FaultEnv, call
from tests.support.waiting import wait_for, wait_until
from workers import keys
from workers.contract import build_task_name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = f"admin-{uuid.uuid4().hex}"
API_KEYS = {
    f"acme-{uuid.uuid4().hex}": {"tenant": "acme", "scopes": ["submit", "read"]},
    f"globex-{uuid.uuid4().hex}": {"tenant": "globex", "scopes": ["submit", "read"]},
}
MODEL_LIMITS = {"scripted": {"requests_per_minute": 600}}
QUEUE = build_task_name("fault_work")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def env() -> Iterator[FaultEnv]:
    with FaultEnv() as scenario:
        yield scenario


@pytest.fixture(scope="module")
def api_url(env: FaultEnv) -> str:
    _, url = env.start_api(
        {
            "TOOLLOOP_API_TOKEN": TOKEN,
            "TOOLLOOP_API_KEYS": json.dumps(API_KEYS),
            "TOOLLOOP_MODEL_LIMITS": json.dumps(MODEL_LIMITS),
        }
    )
    return url


def scrape(api_url: str) -> Samples:
    reply = httpx.get(f"{api_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert reply.status_code == 200, reply.text
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def turns(samples: Samples, kind: str, tenant: str) -> float:
    return samples.get((f"toolloop_turns_{kind}", (("priority", "normal"), ("tenant", tenant))), -1.0)


def queue(samples: Samples, what: str) -> float:
    return samples.get((f"toolloop_tool_queue_{what}", (("queue", QUEUE),)), -1.0)


def scrape_until(api_url: str, check: Any, what: str, timeout_s: float = 30.0) -> Samples:
    """Scrapes until `check(samples)` holds (the API reads Redis at most every few seconds)."""
    found: list[Samples] = []

    def holds() -> bool:
        found[:] = [scrape(api_url)]
        return bool(check(found[0]))

    def seen() -> str:
        backlog = {
            k: v for k, v in (found[0] if found else {}).items() if "queue" in k[0] or "turns_" in k[0]
        }
        return f"last seen: {backlog}"

    wait_until(holds, what, timeout_s, detail=seen)
    return found[0]


def submit(env: FaultEnv, tenant: str, tag: str) -> str:
    prompt = json.dumps({"plan": [{"calls": [call("fault_work", tag=tag)]}, {"text": "Done."}]})
    return env.client.submit(
        prompt=prompt, tools=["fault_work"], model=PLAN_MODEL, limits={"deadline_s": 120}, tenant=tenant
    )


def test_backlog_of_turns_and_tool_calls(env: FaultEnv, api_url: str) -> None:
    # The tool is known (a worker served it a moment ago), and no worker serves it now.
    worker = env.start_worker()
    wait_until(lambda: "fault_work" in read_catalogue(env.redis), "the worker's catalogue")
    worker.stop()

    tag = uuid.uuid4().hex
    submitted = [
        submit(env, tenant, f"{tag}-{n}") for n, tenant in enumerate(["acme"] * 3 + ["globex", "zeta"])
    ]
    samples = scrape_until(
        api_url,
        lambda s: (
            (turns(s, "queued", "acme"), turns(s, "queued", "globex"), turns(s, "queued", "other"))
            == (3, 1, 1)
        ),
        "the submitted turns to be queued by tenant",
    )
    assert turns(samples, "running", "acme") == 0
    assert turns(samples, "queued", "default") == 0  # every configured tenant is there, 0 included

    env.start_orchestrator()
    samples = scrape_until(
        api_url,
        lambda s: queue(s, "length") == 5 and turns(s, "running", "acme") == 3,
        "the orchestrator to run the turns, their calls waiting with no worker",
    )
    assert (turns(samples, "running", "globex"), turns(samples, "running", "other")) == (1, 1)
    assert turns(samples, "queued", "acme") == 0
    first_age_s = queue(samples, "oldest_age_seconds")
    assert 0 < first_age_s < 60
    # The oldest call keeps waiting: a later read finds it older by the time between.
    later = wait_for(
        lambda: age if (age := queue(scrape(api_url), "oldest_age_seconds")) >= first_age_s + 3 else None,
        "the oldest call's age to grow",
        timeout_s=30,
    )
    assert later < first_age_s + 30

    env.start_worker()
    scrape_until(
        api_url,
        lambda s: (
            (queue(s, "length"), queue(s, "oldest_age_seconds")) == (0, 0)
            and all(
                turns(s, kind, t) == 0 for kind in ("queued", "running") for t in ("acme", "globex", "other")
            )
        ),
        "the worker to drain the queue and the turns to end",
        timeout_s=60,
    )
    assert {outcome.status for outcome in env.wait_all(submitted, 30)} == {"completed"}


def test_model_calls_waiting_in_a_budgets_line(env: FaultEnv, api_url: str) -> None:
    line = keys.model_budget_line("scripted")
    samples = scrape_until(
        api_url, lambda s: ("toolloop_model_calls_waiting", (("limit", "scripted"),)) in s, "the gauge"
    )
    assert samples[("toolloop_model_calls_waiting", (("limit", "scripted"),))] == 0
    # Two calls told to come back in a minute, one that was due long ago (it lost its place).
    now_ms = int(time.time() * 1000)
    env.redis.zadd(line, {"call-a": now_ms + 60_000, "call-b": now_ms + 60_000, "call-c": now_ms - 60_000})
    scrape_until(
        api_url,
        lambda s: s.get(("toolloop_model_calls_waiting", (("limit", "scripted"),))) == 2,
        "the waiting calls to be counted",
    )
    env.redis.delete(line)
