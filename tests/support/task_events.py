"""Celery's task events — what Flower shows — captured by a thread of the test process.

    with TaskEvents(redis_url) as events:         # returns once the receiver hears the workers
        ...                                       # publish, run a turn
        events.wait_ended(task_id, times=1)       # its task-succeeded (or -failed, -rejected…) came
        events.of_type("task-received")           # every such event so far, as dicts
        events.of_task(task_id)                   # the task's events so far, as its workers sent them

The receiver binds a queue of its own to Celery's event exchange, then wakes the workers (a `heartbeat`
broadcast): the first worker heartbeat it hears proves the binding, so no event sent after `__enter__`
returned is missed. It stops when the block ends.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Self

from tests.support.waiting import wait_for, wait_until
from workers.app import create_app
from workers.settings import WorkerSettings

# The events that end one delivery of a task.
ENDED = frozenset({"task-succeeded", "task-failed", "task-rejected", "task-revoked"})


class TaskEvents:
    """Every Celery event on `redis_url` while the block runs, in the order received."""

    def __init__(self, redis_url: str) -> None:
        self._app = create_app(WorkerSettings(redis_url=redis_url), main="toolloop-test-events")
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._heard = threading.Event()
        self._receiver: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="task-events", daemon=True)

    def _run(self) -> None:
        try:
            with self._app.connection() as connection:
                self._receiver = self._app.events.Receiver(connection, handlers={"*": self._keep})
                # No timeout: quiet spells between events are waited out until `should_stop`.
                self._receiver.capture(limit=None, timeout=None, wakeup=True)
        except BaseException as exc:  # reported by whoever waits on the receiver
            self._error = exc

    def _keep(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._events.append(event)
        if event.get("type") == "worker-heartbeat":
            self._heard.set()

    def __enter__(self) -> Self:
        self._thread.start()
        wait_until(
            lambda: self._heard.is_set() or not self._thread.is_alive(), "the event receiver to hear a worker"
        )
        if self._error is not None:
            raise RuntimeError("the event receiver failed") from self._error
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)
        self._app.close()

    def events(self) -> list[dict[str, Any]]:
        """Every event received so far."""
        with self._lock:
            return list(self._events)

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        """The events of these types received so far."""
        return [e for e in self.events() if e.get("type") in types]

    def of_task(self, task_id: str) -> list[dict[str, Any]]:
        """The task's events so far in the order its workers sent them, but `task-sent` (the publisher's)."""
        return [e for e in self.events() if e.get("uuid") == task_id and e.get("type") != "task-sent"]

    def count(self, task_id: str, event_type: str) -> int:
        """How many events of `event_type` task `task_id` has had so far."""
        return sum(1 for e in self.of_task(task_id) if e.get("type") == event_type)

    def ended(self, task_id: str) -> list[dict[str, Any]]:
        """The events that ended a delivery of task `task_id`, so far."""
        return [e for e in self.events() if e.get("uuid") == task_id and e.get("type") in ENDED]

    def wait_ended(self, task_id: str, times: int = 1) -> list[dict[str, Any]]:
        """Until `times` deliveries of task `task_id` have ended; their ending events."""
        return wait_for(
            lambda: found if len(found := self.ended(task_id)) >= times else None,
            f"{times} ended deliveries of task {task_id}",
        )
