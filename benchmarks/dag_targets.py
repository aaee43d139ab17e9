"""The targets of :mod:`benchmarks.dag_throughput` (issue 13), and the quick mode's gate.

Why a module of its own: targets are judged on figures measured in the same run,
mostly ratios (engine vs the floor of Redis work, engine vs Celery), so the verdict
does not depend on how fast the machine is. Each target row carries ``gate``: the
value below which ``--quick`` exits 1 (half the target, for ratios only; absolute
targets are reported, never gated).
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["gate_failures", "target_rows"]

FLOOR_RATIO = 0.60
"""Engine steps/s at least this share of the floor's on both fan-outs."""
FLOOR_SHAPES = ("fanout-2000", "fanout-20000")
CPU_US_PER_STEP = 25.0
"""Redis CPU per step on the fan-outs, at most."""
CHAIN_STEPS_PER_S = 5000.0
CELERY_RATIO = 10.0
"""Engine steps/s at least this many times Celery's on the same fan-out."""
SWEEP_SPREAD = 0.15
"""Sweep: each size's Redis CPU per step within +-15% of the sweep's median."""
CALLS_PER_STEP = 1.0
"""Client round trips per step at most (batching), on every shape but chains: a chain's
step can only be claimed by its parent's completion, so one call a step is its minimum
and each worker process's start-up and idle polls come on top (the floor's own chain
measures ~1.005); chains are judged by steps/s."""


def _row(target: str, shape: str, value: float | None, threshold: float, *,
         at_most: bool = False, gate: float | None = None) -> dict[str, Any]:  # fmt: skip
    v = float("nan") if value is None else value
    met = v <= threshold if at_most else v >= threshold
    return {
        "system": "target",
        "target": target,
        "shape": shape,
        "value": round(v, 3),
        "threshold": round(threshold, 3),
        "met": met,
        "gate": gate,
    }


def target_rows(ratios: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Target rows for the measured ``rows`` and ``ratios`` (``as_dict`` forms)."""
    out: list[dict[str, Any]] = []
    for r in ratios:
        if r["system"] == "ratio airuntime/floor" and r["shape"] in FLOOR_SHAPES:
            out.append(_row(f"steps_per_s / floor >= {FLOOR_RATIO}", r["shape"],
                            r["steps_per_s"], FLOOR_RATIO, gate=FLOOR_RATIO / 2))  # fmt: skip
        if r["system"] == "ratio airuntime/celery" and r["steps_per_s"] is not None:
            out.append(_row(f"steps_per_s / celery >= {CELERY_RATIO:g}", r["shape"],
                            r["steps_per_s"], CELERY_RATIO, gate=CELERY_RATIO / 2))  # fmt: skip
    air = [r for r in rows if r["system"] == "airuntime"]
    for r in air:
        if r["shape"] in FLOOR_SHAPES:
            out.append(_row(f"redis_cpu_us_per_step <= {CPU_US_PER_STEP:g}", r["shape"],
                            r["redis_cpu_us_per_step"], CPU_US_PER_STEP, at_most=True))  # fmt: skip
        if r["shape"].startswith("chain-"):
            out.append(_row(f"steps_per_s >= {CHAIN_STEPS_PER_S:g}", r["shape"],
                            r["steps_per_s"], CHAIN_STEPS_PER_S))  # fmt: skip
        else:
            out.append(_row(f"redis_calls_per_step <= {CALLS_PER_STEP:g}", r["shape"],
                            r["redis_calls_per_step"], CALLS_PER_STEP, at_most=True))  # fmt: skip
    out += _sweep_rows([r for r in air if r.get("sweep")])
    return out


def _sweep_rows(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-step cost flat across sizes: each within +-SWEEP_SPREAD of the median."""
    if len(sweep) < 2:
        return []
    median = statistics.median(r["redis_cpu_us_per_step"] for r in sweep)
    out = []
    for r in sorted(sweep, key=lambda r: r["steps"]):
        rel = r["redis_cpu_us_per_step"] / median if median else float("nan")
        row = _row(f"sweep: redis_cpu_us_per_step / median within 1±{SWEEP_SPREAD:g}",
                   r["shape"], rel, 1 + SWEEP_SPREAD, at_most=True)  # fmt: skip
        row["met"] = abs(rel - 1) <= SWEEP_SPREAD
        out.append(row)
    return out


def gate_failures(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gated targets whose value fell below their gate (a regression)."""
    return [
        t for t in targets
        if t["gate"] is not None and not (t["value"] >= t["gate"])
    ]  # fmt: skip
