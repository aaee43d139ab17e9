"""The report's critical path: the longest chain by duration, to the end of the DAG even
when fast steps all last 0 ms (durations are whole milliseconds)."""

from __future__ import annotations

from typing import Any

from airuntime.control_plane.run_trace import _critical_path


def rows(*steps: tuple[str, list[str], int]) -> list[dict[str, Any]]:
    return [{"step": s, "depends_on": d, "duration_ms": ms} for s, d, ms in steps]


def test_instant_steps_give_the_whole_chain_not_its_first_step() -> None:
    assert _critical_path(rows(("a", [], 0), ("b", ["a"], 0), ("c", ["b"], 0))) == (
        ["a", "b", "c"],
        0,
    )


def test_the_longest_duration_wins_over_more_steps() -> None:
    dag = rows(
        ("a", [], 1),
        ("slow", ["a"], 50),
        ("x", ["a"], 5),
        ("y", ["x"], 5),
        ("sink", ["slow", "y"], 0),
    )
    assert _critical_path(dag) == (["a", "slow", "sink"], 51)


def test_an_empty_plan_has_an_empty_path() -> None:
    assert _critical_path([]) == ([], 0)
