"""The README's picture of the dashboard: its main panels drawn with matplotlib from a
Prometheus (no Grafana server needed).

Why this exists: the dashboard ships as Grafana JSON that nobody can look at without a
Grafana; this draws the panels named in :data:`MAIN_PANELS` from the same queries
(Grafana's variables substituted as the dashboard test does) over a time range.
``tests/observability`` runs it against the Prometheus that scraped its workload; set
``AIRUNTIME_DASHBOARD_PNG=docs/images/dashboard.png`` to refresh the README's copy, or
point it at any Prometheus:

    python -m benchmarks.dashboard_png --prometheus http://127.0.0.1:9090 \\
        --minutes 15 --out docs/images/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

MAIN_PANELS = (
    "Shared queue depth per tenant",
    "Oldest waiting run per tenant",
    "Dispatch latency",
    "Admission decisions",
    "Waiting runs and ready instances per tenant",
    "Instances and capacity",
    "Steps per second",
    "Step-slot waits",
    "Loop errors",
    "Archive backlog",
)
BOARD = Path(__file__).resolve().parents[1] / "helm" / "airuntime" / "dashboards" / "airuntime.json"


def _expr(expr: str, range_s: float, step_s: int) -> str:
    rate = max(step_s + 1, 4)
    values = {"__rate_interval": f"{rate}s", "__interval": f"{step_s}s",
              "__range": f"{round(range_s)}s", "tenant": ".*"}  # fmt: skip
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], expr)


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def render(
    prometheus: str, board: dict[str, Any], start: float, end: float, out: Path
) -> dict[str, int]:
    """Draw the main panels into ``out`` (PNG); returns the series drawn per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {p["title"]: p for p in board["panels"]}
    chosen = [panels[t] for t in MAIN_PANELS if t in panels]
    step = max(1, round((end - start) / 300))
    fig, axes = plt.subplots((len(chosen) + 1) // 2, 2, figsize=(12, 2.3 * len(chosen) / 2 + 1))
    drawn: dict[str, int] = {}
    with httpx.Client(base_url=prometheus, timeout=30) as client:
        for ax, panel in zip(axes.flat, chosen, strict=False):
            drawn[panel["title"]] = 0
            for target in panel["targets"]:
                params = {"query": _expr(target["expr"], end - start, step),
                          "start": start, "end": end, "step": step}  # fmt: skip
                body = client.get("/api/v1/query_range", params=params).json()
                for series in body["data"]["result"]:
                    xs = [datetime.fromtimestamp(float(t)) for t, _ in series["values"]]
                    ys = [float(v) for _, v in series["values"]]
                    label = _legend(target.get("legendFormat", ""), series["metric"])
                    marker = "o" if len(xs) < 3 else None  # a lone point shows too
                    ax.plot(xs, ys, label=label or None, linewidth=1.2, marker=marker)
                    drawn[panel["title"]] += 1
            ax.set_title(panel["title"], fontsize=9, loc="left")
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_formatter(matplotlib.dates.DateFormatter("%H:%M:%S"))
            if drawn[panel["title"]]:
                ax.legend(fontsize=6, loc="upper left", ncol=1 + drawn[panel["title"]] // 5)
    for ax in list(axes.flat)[len(chosen) :]:
        ax.axis("off")
    fig.suptitle("airuntime dashboard (main panels, from Prometheus)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=72)
    plt.close(fig)
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--minutes", type=float, default=15, help="time range (last N minutes)")
    parser.add_argument("--out", type=Path, default=Path("docs/images/dashboard.png"))
    args = parser.parse_args()
    end = time.time()
    drawn = render(args.prometheus, json.loads(BOARD.read_text()), end - args.minutes * 60, end,
                   args.out)  # fmt: skip
    print(json.dumps({"out": str(args.out), "series": drawn}))


if __name__ == "__main__":
    main()
