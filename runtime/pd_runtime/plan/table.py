"""Pure: the ranked table and verdict a person reads in the terminal."""

from __future__ import annotations

from typing import Any


def render_table(doc: dict[str, Any]) -> str:
    inputs = doc["inputs"]
    lines = [
        f"{inputs['model']} on {inputs['gpus']}x {inputs['gpu']}: {_prompts(inputs)} prompt -> up to "
        f"{inputs['output_tokens']} output tokens at {inputs['rate']:g} req/s; "
        f"SLO TTFT < {1000 * inputs['ttft_slo_s']:g} ms and ITL < {1000 * inputs['itl_slo_s']:g} ms "
        f"for {100 * inputs['target']:g} % of requests",
        "",
        f"{'#':>2}  {'layout':<18} {'GPUs':>4}  {'attainment (95 % CI)':<21} {'runs':<8} {'goodput':>7} {'/GPU':>6}  "
        f"{'TTFT p50/p99 ms':>16}  {'ITL p50/p99 ms':>15}",
    ]
    if inputs["decode_alone_below"]:
        lines.insert(
            1, f"disaggregated layouts serve prompts below {inputs['decode_alone_below']} tokens on decode alone"
        )
    for row in doc["layouts"]:
        low, high = row["attainmentInterval"]
        attainment = f"{100 * row['attainment']:3.0f} % ({100 * low:.0f}-{100 * high:.0f})"
        runs = row["attainmentRuns"]
        spread = f"{100 * min(runs):.0f}-{100 * max(runs):.0f}" if runs else ""
        ttft = f"{row['ttftMs']['p50']:.0f}/{row['ttftMs']['p99']:.0f}"
        itl = f"{row['itlMs']['p50']:.1f}/{row['itlMs']['p99']:.1f}"
        mark = "  predicted" if row["predicted"] else ""
        lines.append(
            f"{row['rank']:>2}  {row['layout']:<18} {row['gpus']:>4}  {attainment:<21} {spread:<8} "
            f"{row['goodputRate']:>7g} {row['goodputPerGpu']:>6.3g}  {ttft:>16}  {itl:>15}{mark}"
        )
    by_tp: dict[int, list[str]] = {}
    for row in doc["excluded"]:
        by_tp.setdefault(row["tp"], []).append(row["layout"])
    for tp, names in sorted(by_tp.items()):
        first = next(r for r in doc["excluded"] if r["tp"] == tp)
        lines.append(f"    {len(names)} layouts with TP{tp} engines do not fit ({first['reason']}): {', '.join(names)}")
    lines += [
        "",
        f"verdict: {doc['verdict']['text']}",
        f"  {doc['verdict']['reason']}",
        f"predicted: {doc['predictedNote']}",
        f"CI: Wilson over all simulated requests; runs: lowest and highest attainment of one "
        f"{inputs['requests']}-request run, which its arrival sequence alone moves that much",
        f"simulated {len(doc['layouts'])} layouts in {doc['durationSeconds']:g} s",
    ]
    return "\n".join(lines) + "\n"


def _prompts(inputs: dict[str, Any]) -> str:
    mix = inputs["prompt_mix"]
    if not mix:
        return str(inputs["prompt_tokens"])
    return "mixed " + ", ".join(f"{share:g} x {tokens}" for tokens, share in mix)
