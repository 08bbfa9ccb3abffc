"""`toolloop beat`: Celery beat on toolloop's schedules, submitting each due run as a normal turn.

Celery's own loop (`celery.beat.Service`) and heap of entries (`celery.beat.Scheduler.tick`) drive it; what
is ours is `TurnScheduler`:

- its entries come from Redis (`storage.get_schedules`), read again every `reload_s` (a schedule added,
  replaced or removed is seen within a second), each one's `last_run_at` the time its last tick was handled;
- an entry is due by `schedule.build_due` (`TurnTimes`, a celery schedule over our pure rule): one
  catch-up run at most after ticks missed while no beat ran;
- applying an entry is no Celery task but `storage.run_due`: read afresh, skip or cancel the previous run per
  the overlap policy, submit the run through `flows.submit` (checked as any submit), record it;
- only the beat that holds the lease (`keys.BEAT_LEASE`, renewed every third of its TTL and once more
  right before each run) applies entries. Any other stands by, trying for the lease each second, and takes
  over within the TTL when the active one dies. A beat that could not renew in time (paused, cut off) stops
  applying at once; were it to submit a run another beat submitted too, the run's turn id is the same
  (`schedule.build_run_turn_id`) and the second submit changes nothing.

The beat needs Redis only: it publishes nothing to the broker (the orchestrators queue the runs' tool calls).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry, Scheduler, Service
from celery.schedules import BaseSchedule, schedstate

from orchestrator.schedules import storage
from orchestrator.schedules.schedule import Schedule, ScheduleState, TickResult, build_due
from orchestrator.settings import Settings
from orchestrator.store.connection import build_shown_url, connect_sync
from orchestrator.store.runner import Patience, SyncRunner
from orchestrator.submit_checks import ModelNames, check_submit
from workers import keys

log = logging.getLogger("toolloop.beat")

# How often the active beat reads the schedules again, and the longest its loop sleeps.
RELOAD_S = 1.0
# How long one Redis call of the beat waits through an outage before the tick gives up (the loop goes on).
REDIS_PATIENCE_S = 5.0


def build_beat_id() -> str:
    """A beat's id: host, pid and a random part, unique among live beats."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class TurnTimes(BaseSchedule):
    """A toolloop schedule's run times as a Celery schedule: due by `build_due` from the entry's
    `last_run_at` (when its last tick was handled)."""

    def __init__(self, schedule: Schedule, app: Celery) -> None:
        super().__init__(app=app)
        self.schedule = schedule

    def now(self) -> datetime:
        """Now, in UTC (cron expressions are read in UTC)."""
        return datetime.now(UTC)

    def is_due(self, last_run_at: datetime) -> schedstate:
        """(due now, seconds until it is due or until the run after it)."""
        due = build_due(self.schedule, last_run_at.timestamp(), time.time())
        return schedstate(due.is_due, due.next_in_s)

    def remaining_estimate(self, last_run_at: datetime) -> Any:
        """Time until the next run (Celery's `timedelta`)."""
        due = build_due(self.schedule, last_run_at.timestamp(), time.time())
        return datetime.fromtimestamp(due.run_at, UTC) - self.now()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TurnTimes) and other.schedule == self.schedule

    def __hash__(self) -> int:
        return hash(self.schedule.model_dump_json())


class TurnScheduler(Scheduler):
    """Celery's scheduler over toolloop's schedules in Redis, applying entries only while it holds the
    beat lease."""

    # Celery's entries by name (its `schedule` property reads them).
    data: dict[str, ScheduleEntry]

    def __init__(
        self,
        app: Celery,
        *,
        settings: Settings,
        beat_id: str,
        lease_ttl_s: float = keys.BEAT_LEASE_TTL_S,
        reload_s: float = RELOAD_S,
        heartbeat_file: Path | None = None,
    ) -> None:
        self.settings = settings
        self.heartbeat_file = heartbeat_file
        self.beat_id = beat_id
        self.lease_ttl_ms = max(round(lease_ttl_s * 1000), 1000)
        self.reload_s = reload_s
        self.redis = connect_sync(settings.redis_url, settings.redis_ssl_cert_reqs)
        self.runner = SyncRunner(self.redis, where=build_shown_url(settings.redis_url))
        self.check = partial(check_submit, names=ModelNames.from_settings(settings))
        self.active = False
        self._renewed_at = 0.0
        self._loaded_at = 0.0
        self._loaded: dict[str, tuple[str, float | None]] = {}
        # Celery's loop sleeps at most this long: the lease is renewed and the schedules read that often.
        super().__init__(app, max_interval=reload_s)  # type: ignore[arg-type]  # the stubs say int

    def setup_schedule(self) -> None:
        """No entries from Celery's configuration: they come from Redis once the lease is held."""

    @property
    def producer(self) -> Any:
        """None: applying an entry submits a turn to Redis and publishes nothing to the broker."""
        return None

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of Celery's loop while this beat holds the lease; the seconds to sleep before the next."""
        if self.heartbeat_file is not None:
            # A liveness probe reads its age: the loop turns, active or standing by.
            self.heartbeat_file.touch()
        try:
            if not self._keep_lease():
                return self.reload_s
            if time.monotonic() - self._loaded_at >= self.reload_s:
                self._reload()
        except Exception:
            log.exception("beat %s: Redis could not be read; trying again", self.beat_id)
            return self.reload_s
        return min(super().tick(*args, **kwargs), self.reload_s)

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Handle a due entry: its schedule's run, skipped or submitted (`storage.run_due`)."""
        del producer, advance, kwargs  # nothing is published; Celery's tick has reserved the entry already
        name = entry.name or ""
        if not self._keep_lease(force=True):
            return None
        flow = storage.run_due(
            name, time.time(), check=self.check, tool_gone_after_s=self.settings.tool_gone_after_s
        )
        tick = self.runner.run_flow(flow, Patience.for_s(REDIS_PATIENCE_S))
        match tick.result:
            case TickResult.SUBMITTED:
                cancelled = f" (cancelled {tick.previous})" if tick.previous else ""
                log.info("schedule %s: submitted turn %s%s", name, tick.turn_id, cancelled)
            case TickResult.SKIPPED:
                log.info("schedule %s: skipped, its previous run %s has not finished", name, tick.previous)
            case TickResult.FAILED:
                log.warning("schedule %s: nothing submitted: %s", name, tick.error)
            case TickResult.NOT_DUE | TickResult.GONE:
                log.debug("schedule %s: %s", name, tick.result.value)
        self._loaded_at = 0.0  # read the state it just wrote before the next pass
        return tick

    def close(self) -> None:
        """Release the lease (a standby takes over at once), then Celery's own closing."""
        try:
            if self.active:
                self.runner.run(storage.release_lease(self.beat_id))
                log.info("beat %s: lease released", self.beat_id)
        except Exception:
            log.warning("beat %s: the lease could not be released; it expires by itself", self.beat_id)
        finally:
            self.active = False
            super().close()
            self.redis.close()

    def _keep_lease(self, *, force: bool = False) -> bool:
        now = time.monotonic()
        if self.active and not force and now - self._renewed_at < self.lease_ttl_ms / 3000:
            return True
        held = self.runner.run_flow(storage.take_lease(self.beat_id, self.lease_ttl_ms))
        if held:
            self._renewed_at = now
        if held and not self.active:
            log.info("beat %s: active (holds the lease)", self.beat_id)
            self._loaded_at = 0.0
        elif not held and self.active:
            log.warning("beat %s: lost the lease to another beat; standing by", self.beat_id)
            self._forget()
        elif not held and not self._loaded_at and not self._loaded:
            self._loaded_at = -1.0  # say "standing by" once
            log.info("beat %s: standing by (another beat is active)", self.beat_id)
        self.active = held
        return held

    def _forget(self) -> None:
        self.data = {}
        self._loaded = {}
        self._heap = None

    def _reload(self) -> None:
        schedules: dict[str, Schedule] = self.runner.run(storage.get_schedules())
        states: dict[str, ScheduleState] = (
            self.runner.run(storage.get_states(sorted(schedules))) if schedules else {}
        )
        self._loaded_at = time.monotonic()
        seen = {
            name: (schedule.model_dump_json(), states[name].last_tick_at)
            for name, schedule in schedules.items()
        }
        if seen == self._loaded:
            return
        self.data = {
            name: ScheduleEntry(
                name=name,
                task="toolloop.schedule",
                schedule=TurnTimes(schedule, self.app),
                last_run_at=datetime.fromtimestamp(states[name].last_tick_at or schedule.created_at, UTC),
                app=self.app,
            )
            for name, schedule in schedules.items()
        }
        added = sorted(set(seen) - set(self._loaded))
        removed = sorted(set(self._loaded) - set(seen))
        if added or removed:
            log.info("beat %s: %d schedules (added %s, removed %s)", self.beat_id, len(seen), added, removed)
        self._loaded = seen
        self._heap = None  # Celery's tick rebuilds its heap from the new entries


class BeatService(Service):
    """Celery's beat loop, on a `TurnScheduler`."""

    def __init__(self, app: Celery, scheduler: TurnScheduler) -> None:
        super().__init__(app, max_interval=scheduler.reload_s)  # type: ignore[arg-type]  # stubs: int
        self._turn_scheduler = scheduler

    def get_scheduler(self, lazy: bool = False, extension_namespace: str = "") -> Scheduler:
        """The scheduler this service was given."""
        return self._turn_scheduler


def build_beat_app() -> Celery:
    """The Celery app of the beat: UTC, no broker connection (nothing is published), no remote control."""
    app = Celery("toolloop-beat", set_as_current=False)
    app.conf.update(enable_utc=True, timezone="UTC", beat_enable_remote_control=False)
    return app


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise SystemExit(0)  # Celery's loop ends on it, syncing and closing the scheduler (the lease released)


def run_beat(
    settings: Settings,
    *,
    beat_id: str | None = None,
    lease_ttl_s: float = keys.BEAT_LEASE_TTL_S,
    heartbeat_file: Path | None = None,
) -> None:
    """Run the beat until SIGTERM or SIGINT: active while it holds the lease, standing by otherwise;
    `heartbeat_file` is touched on each pass of its loop (a liveness probe reads its age)."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    app = build_beat_app()
    scheduler = TurnScheduler(
        app,
        settings=settings,
        beat_id=beat_id or build_beat_id(),
        lease_ttl_s=lease_ttl_s,
        heartbeat_file=heartbeat_file,
    )
    log.info("beat %s: starting on %s", scheduler.beat_id, build_shown_url(settings.redis_url))
    BeatService(app, scheduler).start()
