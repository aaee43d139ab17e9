"""The console's DAG layout and Gantt geometry (pure functions over plan and trace JSON)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airuntime.control_plane.console.charts import LABEL_W, MAX_ROWS, WIDTH, gantt_rows
from airuntime.control_plane.console.layout import BANDS, MAX_PER_LAYER, layout, plan_deps
from airuntime.engine.pipeline.compile import compile_pipeline
from airuntime.engine.pipeline.spec import PipelineSpec
from tests.control_plane.support import fan_pipeline


def _plan(doc: dict[str, Any]) -> dict[str, Any]:
    return compile_pipeline(PipelineSpec.model_validate(doc)).to_dict()


def test_plan_deps_include_references() -> None:
    plan = _plan(
        {
            "id": "refs",
            "steps": [
                {"id": "a", "uses": "noop"},
                {"id": "b", "uses": "echo", "with": {"value": "${steps.a.output}"}},
                {"id": "c", "uses": "noop", "depends_on": ["a", "b"]},
            ],
        }
    )
    assert plan_deps(plan) == {"a": (), "b": ("a",), "c": ("a", "b")}


@st.composite
def dags(draw: st.DrawFn) -> dict[str, tuple[str, ...]]:
    n = draw(st.integers(1, 40))
    deps: dict[str, tuple[str, ...]] = {}
    for i in range(n):
        earlier = [f"s{j}" for j in range(i)]
        picked = (
            draw(st.lists(st.sampled_from(earlier), unique=True, max_size=4)) if earlier else []
        )
        deps[f"s{i}"] = tuple(picked)
    return deps


@settings(max_examples=60, deadline=None)
@given(dags(), st.integers(1, 6))
def test_every_edge_points_right_and_every_step_is_drawn_once(
    deps: dict[str, tuple[str, ...]], width: int
) -> None:
    dag = layout(deps, max_per_layer=width)
    drawn = [s for n in dag.nodes for s in n.steps]
    assert sorted(drawn) == sorted(deps)
    by_id = {n.node_id: n for n in dag.nodes}
    for step, parents in deps.items():
        for p in parents:
            a, b = by_id[dag.node_of[p]], by_id[dag.node_of[step]]
            assert a.layer < b.layer, (p, step)
            assert (a, b) in dag.edges
    for node in dag.nodes:
        layer_size = sum(1 for s in deps if by_id[dag.node_of[s]].layer == node.layer)
        assert node.summary == (layer_size > width)
    positions = {(n.layer, n.row) for n in dag.nodes}
    assert len(positions) == len(dag.nodes), "no two nodes on one spot"


def test_a_2000_step_fan_out_collapses_into_a_summary_node() -> None:
    dag = layout(plan_deps(_plan(fan_pipeline(2000))))
    assert [n.node_id for n in dag.nodes] == ["root", "layer-1", "sink"]
    summary = dag.nodes[1]
    assert summary.summary and len(summary.steps) == 1998 and summary.label == "1998 steps"
    assert [(a.node_id, b.node_id) for a, b in dag.edges] == [
        ("layer-1", "sink"),
        ("root", "layer-1"),
    ]
    states = {s: "completed" for s in summary.steps[:10]}
    assert dag.counts(states) == {"layer-1": {"completed": 10, "pending": 1988}}
    assert dag.height < 200, "the drawing stays small"


def test_a_layer_at_the_limit_is_drawn_step_by_step() -> None:
    dag = layout(plan_deps(_plan(fan_pipeline(MAX_PER_LAYER + 2))))
    assert len(dag.nodes) == MAX_PER_LAYER + 2 and not any(n.summary for n in dag.nodes)


def test_gantt_bars_span_the_axis_and_keep_attempts() -> None:
    attempt = {"attempt": 1, "worker": "i@h/w0", "outcome": "failed"}
    trace = {
        "created_at_ms": 1000,
        "finished_at_ms": 3000,
        "steps": [
            {"step": "b", "status": "completed", "attempts": [
                {**attempt, "claimed_at_ms": 1500, "ended_at_ms": 2000},
                {**attempt, "attempt": 2, "claimed_at_ms": 2500, "ended_at_ms": 3000,
                 "outcome": "completed"},
            ]},
            {"step": "a", "status": "completed", "attempts": [
                {**attempt, "claimed_at_ms": 1000, "ended_at_ms": 1500, "outcome": "completed"}
            ]},
            {"step": "never", "status": "pending", "attempts": []},
        ],
    }  # fmt: skip
    chart = gantt_rows(trace, now_ms=9999)
    assert [r.step for r in chart.rows] == ["a", "b"], "ordered by first claim"
    assert chart.never_ran == 1 and chart.hidden == 0 and chart.span_ms == 2000
    a, b = chart.rows
    assert a.bars[0].x == LABEL_W and a.bars[0].w == WIDTH / 4
    assert [bar.status for bar in b.bars] == ["failed", "completed"]
    assert b.bars[1].x + b.bars[1].w == LABEL_W + WIDTH


def test_gantt_rows_are_capped_and_a_running_attempt_ends_now() -> None:
    steps = [
        {"step": f"s{i:04}", "status": "running",
         "attempts": [{"attempt": 1, "claimed_at_ms": 10 + i, "ended_at_ms": None}]}
        for i in range(MAX_ROWS + 5)
    ]  # fmt: skip
    chart = gantt_rows({"created_at_ms": 0, "steps": steps}, now_ms=10_000)
    assert len(chart.rows) == MAX_ROWS and chart.hidden == 5
    assert chart.span_ms == 10_000 and chart.rows[0].bars[0].status == "running"


def test_a_2000_step_chain_is_drawn_as_bands_of_layers() -> None:
    deps = {f"c{i}": ((f"c{i - 1}",) if i else ()) for i in range(2000)}
    dag = layout(deps)
    assert len(dag.nodes) == BANDS and all(n.summary for n in dag.nodes)
    assert [len(n.steps) for n in dag.nodes] == [50] * BANDS
    assert dag.nodes[0].label == "50 steps, layers 0-49"
    assert sorted((a.layer, b.layer) for a, b in dag.edges) == [
        (i, i + 1) for i in range(BANDS - 1)
    ]
    assert set(dag.node_of) == set(deps)
