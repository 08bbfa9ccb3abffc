"""A tool module whose worker meets an "Unrecoverable error" as soon as it starts consuming: a consumer
bootstep that raises, as a bug in Celery's consumer would. The worker must then exit non-zero."""

from __future__ import annotations

from typing import Any

from celery import bootsteps, signals

from workers import tool


@tool()
def doomed() -> str:
    """Never runs: its worker stops before it consumes."""
    return "unreachable"


class Doom(bootsteps.StartStopStep):
    """A consumer step that raises when the consumer starts."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        raise RuntimeError("a consumer step failed")


def _add_doom(sender: Any = None, **_: Any) -> None:
    sender.app.steps["consumer"].add(Doom)


signals.worker_init.connect(_add_doom, weak=False)
