"""Time limits that fire late are checked again once the pool's results are read (issue 30, item 4).

Celery's prefork pool keeps a call's soft and hard limits as timers on the worker's event loop, in the main
process, and cancels them when it reads the call's result from the pool process. A Redis that hangs (a
black-holed link) holds that loop for as long: the calls finish meanwhile, each pool process writes its
result down its pipe and waits, idle, for the next task. When the loop runs again it fires the timers that
came due first and reads the pipes after, so each finished call's soft limit reaches an idle pool process
(`SIGUSR1`: `SoftTimeLimitExceeded` kills it, or a task it has just been given), and its hard limit kills
one, with a `timeout` written for a call that succeeded. Seen: ~19 s late, at every pool process that had
finished a call during a 30 s partition.

`LateLimitGuard` wraps the pool's two timer callbacks: a limit that fires more than `LATE_S` after it came due
(the loop was held) is looked at again `RECHECK_S` later, by which time the loop has read what the pool
processes sent; a call that finished meanwhile is no longer in the pool's cache, and nothing fires. A limit
on time is applied as before, and a late one of a call still running fires at most `RECHECK_S` later still.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, bootsteps

logger = logging.getLogger(__name__)

# Later than this past its due time, a limit's timer was held up by the event loop, not merely scheduled.
LATE_S = 1.0
# Long enough for the loop to read every pool process's pipe once it runs again (it polls in between).
RECHECK_S = 0.5


def is_late(accepted_at: float | None, limit_s: float, now: float) -> bool:
    """True when a limit of `limit_s` for a job its pool process took at `accepted_at` (monotonic seconds,
    billiard's clock) fires more than `LATE_S` after it came due."""
    return accepted_at is not None and now - (accepted_at + limit_s) > LATE_S


def guard_time_limits(pool: Any, clock: Callable[[], float] = time.monotonic) -> bool:
    """Wrap the soft and hard limit callbacks of Celery's `AsynPool` `pool`; False for a pool without them
    (not prefork, or a Celery whose pool keeps its timers elsewhere)."""
    soft = getattr(pool, "_on_soft_timeout", None)
    hard = getattr(pool, "_on_hard_timeout", None)
    cache = getattr(pool, "_cache", None)
    if soft is None or hard is None or cache is None:
        return False

    def accepted_at(job: Any) -> float | None:
        result = cache.get(job)
        return None if result is None else getattr(result, "_time_accepted", None)

    def on_soft_timeout(job: Any, soft_s: float, hard_s: float | None, hub: Any) -> None:
        if is_late(accepted_at(job), soft_s, clock()):
            logger.info("soft time limit of job %s fired late; looked at again once results are read", job)
            hub.call_later(RECHECK_S, soft, job, soft_s, hard_s, hub)
            return
        soft(job, soft_s, hard_s, hub)

    def on_hard_timeout(job: Any) -> None:
        result = cache.get(job)
        hard_s = getattr(result, "_timeout", None)
        hub = getattr(pool, "_toolloop_hub", None)
        if hub is not None and hard_s and is_late(accepted_at(job), float(hard_s), clock()):
            logger.info("hard time limit of job %s fired late; looked at again once results are read", job)
            hub.call_later(RECHECK_S, hard, job)
            return
        hard(job)

    pool._on_soft_timeout = on_soft_timeout
    pool._on_hard_timeout = on_hard_timeout
    return True


class LateLimitGuard(bootsteps.StartStopStep):
    """The worker bootstep that guards its pool's time limits (`guard_time_limits`)."""

    label = "toolloop late time limits"
    requires = ("celery.worker.components:Pool",)

    def start(self, parent: Any) -> None:
        """Wrap the pool's limit callbacks before the first task runs."""
        pool = getattr(getattr(parent, "pool", None), "_pool", None)
        if pool is None:
            return
        pool._toolloop_hub = getattr(parent, "hub", None)
        if not guard_time_limits(pool):
            logger.info("time limits are not guarded against a held event loop with this pool")


def connect_late_limit_guard(app: Celery) -> None:
    """Register `LateLimitGuard` on `app`'s workers."""
    app.steps["worker"].add(LateLimitGuard)
