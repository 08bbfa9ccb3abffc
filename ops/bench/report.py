"""The figures of a run: one JSON object per line, then a readable table."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Metric:
    """One figure; `baseline`/`ratio` when it is compared with plain Celery measured in the same run."""

    metric: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    goal: str | None = None
    met: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The JSON line: `metric`, `value`, `unit`, and the comparison and goal when there is one."""
        record: dict[str, Any] = {"metric": self.metric, "value": round(self.value, 3), "unit": self.unit}
        if self.baseline is not None:
            record["baseline"] = round(self.baseline, 3)
        if self.ratio is not None:
            record["ratio"] = round(self.ratio, 3)
        if self.goal is not None:
            record["goal"] = self.goal
            record["met"] = self.met
        record.update(self.extra)
        return json.dumps(record)


def compared(
    metric: str, value: float, baseline: float, unit: str, *, goal_ratio: float, lower_is_better: bool
) -> Metric:
    """A figure against its plain-Celery baseline, with a goal on the ratio (value / baseline)."""
    ratio = value / baseline if baseline else float("inf")
    met = ratio <= goal_ratio if lower_is_better else ratio >= goal_ratio
    goal = f"ratio {'<=' if lower_is_better else '>='} {goal_ratio:g}"
    return Metric(metric, value, unit, baseline=baseline, ratio=ratio, goal=goal, met=met)


def with_goal(
    metric: str, value: float, unit: str, *, limit: float, extra: dict[str, Any] | None = None
) -> Metric:
    """A figure with an upper bound as its goal."""
    return Metric(metric, value, unit, goal=f"<= {limit:g}", met=value <= limit, extra=extra or {})


def percentile(values: Sequence[float], pct: float) -> float:
    """The `pct` percentile (inclusive method, so p99 of few samples stays inside them)."""
    if not values:
        raise ValueError("no samples")
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[int(pct) - 1] if pct < 100 else max(values)


def print_table(metrics: Sequence[Metric], console: Console, title: str) -> None:
    """The human-readable view of the same figures."""
    table = Table(title=title)
    for column in ("metric", "value", "unit", "plain Celery", "ratio", "goal", "met"):
        table.add_column(column, justify="left" if column in ("metric", "unit", "goal") else "right")
    for m in metrics:
        met = "" if m.met is None else ("yes" if m.met else "NO")
        table.add_row(
            m.metric,
            f"{m.value:.3f}",
            m.unit,
            "" if m.baseline is None else f"{m.baseline:.3f}",
            "" if m.ratio is None else f"{m.ratio:.3f}",
            m.goal or "",
            met,
        )
    console.print(table)
