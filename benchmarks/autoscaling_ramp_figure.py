"""Draw docs/img/autoscaling-ramp.png: the e2e ramp of spec.autoscaling (replicas, demand, capacity and the
client's SLO attainment over time) from the timeline e2e/tests/test_autoscaling_ramp.py records.

Usage (the test needs the e2e lock and root, as `make e2e`):
  PD_E2E_RAMP_TIMELINE=/tmp/ramp.json .venv/bin/pytest -q e2e/tests/test_autoscaling_ramp.py
  .venv/bin/python benchmarks/autoscaling_ramp_figure.py /tmp/ramp.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "docs" / "img" / "autoscaling-ramp.png"
BIN_S = 10.0  # attainment of the requests sent in each bin


def bins(requests: list[dict[str, Any]], end: float) -> tuple[list[float], list[float], list[float]]:
    """Per bin of arrivals: its centre, the attainment (%) and the 90th percentile TTFT (ms)."""
    centres, attained, ttft = [], [], []
    start = 0.0
    while start < end:
        sent = [r for r in requests if start <= r["at"] < start + BIN_S]
        if sent:
            centres.append(start + BIN_S / 2)
            attained.append(100 * sum(r["good"] for r in sent) / len(sent))
            times = sorted(r["ttft_ms"] or 0.0 for r in sent)
            ttft.append(times[min(len(times) - 1, int(0.9 * len(times)))])
        start += BIN_S
    return centres, attained, ttft


def draw(timeline: dict[str, Any], output: Path) -> None:
    samples, capacity = timeline["samples"], float(timeline["capacity"]["requestsPerSecond"])
    utilization, slo = timeline["targetUtilization"], timeline["slo"]
    t = [s["t"] for s in samples]
    end = max(t)
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(9, 8), sharex=True, height_ratios=(1, 1.4, 1))
    for axis in (top, middle, bottom):
        for start, stop in timeline["gaps"]:
            axis.axvspan(start, min(stop, end), color="tab:orange", alpha=0.15, lw=0)
    top.step(t, [s["replicas"] for s in samples], where="post", label="spec.replicas", color="tab:blue")
    top.step(t, [s["available"] for s in samples], where="post", label="available", color="tab:green", ls="--")
    top.set_ylabel("replicas")
    top.set_ylim(0, 4.6)
    top.set_yticks(range(0, 5))
    top.legend(loc="lower right", fontsize=8, ncol=2)
    middle.plot(t, [s["offered"] for s in samples], label="offered by the client", color="black", lw=1)
    middle.plot(t, [s["demand"] for s in samples], label="status.demand (30 s window)", color="tab:red")
    middle.step(
        t,
        [utilization * (s["replicas"] or 0) * capacity for s in samples],
        where="post",
        label=f"{utilization:g} x replicas x capacity (scale-up threshold)",
        color="tab:blue",
        ls=":",
    )
    middle.axhline(capacity, color="tab:gray", ls="--", lw=0.8, label=f"capacity of one replica ({capacity:.3g}/s)")
    middle.set_ylabel("requests / s")
    middle.legend(loc="upper left", fontsize=8)
    centres, attained, ttft = bins(timeline["requests"], end)
    bottom.plot(centres, attained, marker=".", color="tab:purple", label=f"attainment per {BIN_S:g} s of arrivals")
    bottom.axhline(100 * slo["target"], color="tab:purple", ls="--", lw=0.8, label="SLO target")
    bottom.set_ylim(0, 105)
    bottom.set_ylabel("attainment %")
    bottom.set_xlabel("seconds (shaded: start-up gaps, from a scale-up until its replicas are available + TTFT bound)")
    latency = bottom.twinx()
    latency.plot(centres, ttft, color="tab:brown", lw=1, label="TTFT p90 (ms)")
    latency.axhline(slo["ttft_ms"], color="tab:brown", ls=":", lw=0.8, label="TTFT bound")
    latency.set_ylim(0, 1.3 * slo["ttft_ms"])
    latency.set_ylabel("TTFT ms")
    handles = bottom.get_legend_handles_labels()[0] + latency.get_legend_handles_labels()[0]
    bottom.legend(handles=handles, loc="center left", fontsize=8, ncol=2)
    for phase in timeline["phases"]:
        for axis in (top, middle, bottom):
            axis.axvline(phase["t"], color="tab:gray", lw=0.5)
        top.annotate(phase["name"], (phase["t"], 4.2), fontsize=7, xytext=(2, 0), textcoords="offset points")
    failed = sum(r["error"] is not None for r in timeline["requests"])
    fig.suptitle(
        f"spec.autoscaling ramp on simulated engines (timeScale {timeline['timeScale']:g}): "
        f"{len(timeline['requests'])} requests, {failed} failed; "
        f"SLO TTFT {slo['ttft_ms']:g} ms, ITL {slo['itl_ms']:g} ms",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", type=Path, help="the JSON the test wrote ($PD_E2E_RAMP_TIMELINE)")
    parser.add_argument("--output", type=Path, default=FIGURE)
    args = parser.parse_args()
    draw(json.loads(args.timeline.read_text()), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
