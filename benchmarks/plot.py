"""The README's throughput picture: steps/s and runs/s against size, airuntime beside its
floor and its peer, drawn with matplotlib from the benchmarks' own JSON.

Why this exists: the numbers in the README come from two benchmarks run on the same
machine; a picture shows at a glance whether cost per step and per run stays flat with
size and how far airuntime is from the floor of Redis work and from Celery. Run the
benchmarks with ``--json``, then draw:

    python -m benchmarks.dag_throughput --json > /tmp/dag.json
    python -m benchmarks.dispatch --json --sweep 1000 10000 100000 > /tmp/dispatch.json
    python -m benchmarks.plot --dag /tmp/dag.json --dispatch /tmp/dispatch.json \\
        --out docs/images/benchmarks.png

Left: steps/s of the fan-out size sweep (``sweep: true`` rows) for airuntime and the
floor, with Celery's chord as a point. Right: completed runs/s of the dispatch sweep,
with Celery's independent jobs as a point at the size it ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _series(rows: list[dict[str, Any]], system: str) -> tuple[list[int], list[float]]:
    points = sorted(
        (int(r["steps"]), float(r["steps_per_s"]))
        for r in rows
        if r.get("system") == system and r.get("sweep")
    )
    return [p[0] for p in points], [p[1] for p in points]


def _dag_panel(ax: Any, rows: list[dict[str, Any]]) -> None:
    for system, style in (("airuntime", "o-"), ("floor", "s--")):
        x, y = _series(rows, system)
        if x:
            ax.plot(x, y, style, label=f"{system} (fan-out)")
    for r in rows:
        if r.get("system") == "celery":
            ax.plot([r["steps"]], [r["steps_per_s"]], "^", label=f"celery chord ({r['shape']})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("steps in the DAG")
    ax.set_ylabel("steps/s")
    ax.set_title("Engine: steps/s against DAG size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def _dispatch_panel(ax: Any, report: dict[str, Any]) -> None:
    sweep = sorted(report.get("sweep") or [], key=lambda row: row["runs"])
    if sweep:
        ax.plot(
            [row["runs"] for row in sweep],
            [row["completed_runs_per_s"] for row in sweep],
            "o-",
            label="airuntime (backlog, 3 instances)",
        )
    for r in report.get("results", []):
        if r.get("scenario") in ("backlog", "streaming") and not sweep:
            ax.plot(
                [r["runs"]], [r["completed_runs_per_s"]], "o", label=f"airuntime {r['scenario']}"
            )
    celery = report.get("celery_jobs_per_s")
    if celery:
        runs = next((r["runs"] for r in report.get("results", []) if "runs" in r), 1000)
        ax.plot([runs], [celery], "^", label="celery (independent jobs)")
    ax.set_xscale("log")
    ax.set_xlabel("single-step runs submitted")
    ax.set_ylabel("completed runs/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Dispatch: runs/s against backlog size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def draw(dag: list[dict[str, Any]], dispatch: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    _dag_panel(left, dag)
    _dispatch_panel(right, dispatch)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__)
    parser.add_argument("--dag", type=Path, required=True, help="dag_throughput --json output")
    parser.add_argument("--dispatch", type=Path, required=True, help="dispatch --json output")
    parser.add_argument("--out", type=Path, default=Path("docs/images/benchmarks.png"))
    args = parser.parse_args(argv)
    draw(json.loads(args.dag.read_text()), json.loads(args.dispatch.read_text()), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
