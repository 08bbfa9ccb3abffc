"""The pure parts of `workers.descendants`: reading `/proc/<pid>/stat`, and which orphans a sweep ends."""

from __future__ import annotations

from workers.descendants import ProcStat, SweepPlan, build_sweep_plan, parse_stat

# A real line's shape, with a command name holding a space and a parenthesis.
STAT = "4242 (my tool) x) S 17 4242 4242 0 -1 4194560 98 0 0 0 1 0 0 0 20 0 1 0 987654 3133440 360 1844 0"


def test_parse_stat_counts_fields_from_the_last_parenthesis() -> None:
    assert parse_stat(STAT) == ProcStat(state="S", ppid=17, start_ticks=987654)


def test_parse_stat_refuses_what_is_not_a_stat_line() -> None:
    assert parse_stat("") is None
    assert parse_stat("12 (x) S 1 2") is None
    assert parse_stat(STAT.replace("987654", "soon")) is None


def _stat(state: str = "S", start: int = 100) -> ProcStat:
    return ProcStat(state=state, ppid=1, start_ticks=start)


def test_an_orphan_first_seen_is_only_suspected() -> None:
    plan = build_sweep_plan({10: _stat(), 20: _stat()}, pool=frozenset({10}), spared=set(), suspects=set())
    assert plan == SweepPlan(suspects=frozenset({(20, 100)}))


def test_an_orphan_seen_twice_is_killed_and_stays_suspected_until_reaped() -> None:
    plan = build_sweep_plan({20: _stat()}, pool=frozenset(), spared=set(), suspects={(20, 100)})
    assert plan == SweepPlan(kill=(20,), suspects=frozenset({(20, 100)}))
    dead = build_sweep_plan({20: _stat("Z")}, pool=frozenset(), spared=set(), suspects={(20, 100)})
    assert dead == SweepPlan(reap=(20,))


def test_pool_processes_and_spared_children_are_never_touched() -> None:
    children = {10: _stat("Z"), 30: _stat(start=7)}
    plan = build_sweep_plan(children, pool={10}, spared={(30, 7)}, suspects={(10, 100), (30, 7)})
    assert plan == SweepPlan()


def test_a_reused_pid_is_a_new_suspect_not_the_old_one() -> None:
    plan = build_sweep_plan(
        {20: _stat(start=555)}, pool=frozenset(), spared={(20, 100)}, suspects={(20, 100)}
    )
    assert plan == SweepPlan(suspects=frozenset({(20, 555)}))
