"""Simulate one layout over a grid of rates: attainment per rate and the latency distributions at the
rate the user asked about. Pure: the discrete-event simulation has no clock but its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pd_runtime.bench.stats import Distribution, summarize, wilson_interval
from pd_runtime.plan.layouts import NodeLayout
from pd_runtime.sim.profiles import Profile
from pd_runtime.sim.system import RequestResult, Workload, simulate


@dataclass(frozen=True)
class Demand:
    """The workload and SLOs to plan for (the flags of `pdctl plan`)."""

    rate: float
    rates: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    ttft_slo_s: float
    itl_slo_s: float
    target: float = 0.9
    requests: int = 100
    seeds: int = 4
    ignore_eos: bool = False
    prompt_mix: tuple[tuple[int, float], ...] = ()
    """A mixed workload's prompt lengths and shares (``Workload.prompt_mix``); ``prompt_tokens`` is then
    the longest, which the memory fit takes."""
    decode_alone_below: int = 0
    """Disaggregated layouts serve prompts of fewer tokens on decode alone (``Topology.decode_alone_below``)."""

    def workload(self, rate: float, seed: int) -> Workload:
        return Workload(
            rate=rate,
            requests=self.requests,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            ignore_eos=self.ignore_eos,
            seed=seed,
            prompt_mix=self.prompt_mix,
        )


@dataclass(frozen=True)
class RatePoint:
    rate: float
    good: int
    total: int

    @property
    def attainment(self) -> float:
        return self.good / self.total if self.total else 0.0


@dataclass
class Priced:
    layout: NodeLayout
    curve: list[RatePoint]
    at_rate: RatePoint
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    ttft_misses: int = 0
    itl_misses: int = 0
    runs: list[float] = field(default_factory=list)
    """Attainment of each arrival sequence at the requested rate."""

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.at_rate.good, self.at_rate.total)

    def goodput(self, target: float) -> float:
        """DistServe's goodput on the grid: the highest rate up to which every rate meets the target."""
        best = 0.0
        for point in sorted(self.curve, key=lambda p: p.rate):
            if point.attainment < target:
                break
            best = point.rate
        return best

    @property
    def ttft(self) -> Distribution:
        return summarize(self.ttft_s)

    @property
    def itl(self) -> Distribution:
        return summarize(self.itl_s)


@dataclass(frozen=True)
class Sample:
    """One (layout, rate) cell: its good count and, per request, TTFT, ITL and which SLO each missed."""

    point: RatePoint
    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    runs: tuple[float, ...] = ()
    """Attainment of each arrival sequence: how much one 100-request run swings with its arrivals alone."""


def sample(profile: Profile, layout: NodeLayout, demand: Demand, rate: float) -> Sample:
    """Simulate ``demand.seeds`` arrival sequences of ``demand.requests`` requests at ``rate``."""
    results: list[RequestResult] = []
    runs: list[float] = []
    for seed in range(demand.seeds):
        topology = replace(layout.topology(), decode_alone_below=demand.decode_alone_below)
        run = simulate(profile, topology, demand.workload(rate, seed))
        runs.append(sum(r.good(demand.ttft_slo_s, demand.itl_slo_s) for r in run) / len(run))
        results += run
    good = sum(r.good(demand.ttft_slo_s, demand.itl_slo_s) for r in results)
    point = RatePoint(rate, good, len(results))
    return Sample(point, tuple(r.ttft for r in results), tuple(r.itl for r in results), tuple(runs))


def assemble(layout: NodeLayout, demand: Demand, curve: Sequence[Sample], at_rate: Sample) -> Priced:
    """A layout's curve over the grid and its detail at the requested rate."""
    priced = Priced(layout=layout, curve=[s.point for s in curve], at_rate=at_rate.point, runs=list(at_rate.runs))
    priced.ttft_s = list(at_rate.ttft_s)
    priced.itl_s = list(at_rate.itl_s)
    priced.ttft_misses = sum(t >= demand.ttft_slo_s for t in at_rate.ttft_s)
    priced.itl_misses = sum(i >= demand.itl_slo_s for i in at_rate.itl_s)
    return priced
