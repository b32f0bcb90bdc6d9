"""Pure discrete-event simulation of a whole deployment: open-loop arrivals -> proxy -> engines.

It drives the same ``Scheduler`` and ``timing`` functions as the live engine, with a virtual clock, so
a 100-request, 2-minute experiment runs in well under a second. ``benchmarks/calibrate_sim.py`` tunes the
calibrated profile with it; the live processes (scaled time) then confirm the numbers end to end.

Topologies: ``colocated`` (N engines behind round robin, each doing prefill and decode), ``write`` and
``read`` (x prefill and y decode engines, each side in round robin, MoRI-IO write or read mode, as in
docs/protocol.md#read-mode, docs/protocol.md#write-mode and the seed article's TTFT decomposition).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pd_runtime.sim.profiles import Profile
from pd_runtime.sim.scheduler import Scheduler, Sequence, Step, TokenEvent
from pd_runtime.sim.timing import KVLink, kv_transfer_time, step_time, write_tail_time
from pd_runtime.workload.arrivals import Arrival, arrival_offsets

Kind = Literal["colocated", "write", "read"]


@dataclass(frozen=True)
class EngineShape:
    tp: int = 4
    max_batched_tokens: int = 8192
    max_num_seqs: int = 1024


@dataclass(frozen=True)
class Topology:
    kind: Kind
    engines: int = 1
    """Colocated engines behind round robin (colocated only)."""
    engine: EngineShape = EngineShape()
    prefill: EngineShape = EngineShape(tp=4, max_batched_tokens=4096, max_num_seqs=64)
    decode: EngineShape = EngineShape(tp=4, max_batched_tokens=4096, max_num_seqs=64)
    prefills: int = 1
    """Prefill engines (xPyD; write/read), each request to the next in round robin, in the discrete-event
    model and as real processes (``stack.launch``)."""
    decodes: int = 1
    """Decode engines (write/read), round robin independently of the prefill side."""
    backend: Literal["rdma", "xgmi"] = "rdma"
    """How the KV moves between a prefill and a decode engine (``timing.KVLink``)."""
    decode_alone_below: int = 0
    """Selective disaggregation (write/read; the proxy's ``--disaggregation threshold``): a prompt of fewer
    tokens is one plain request to decode, which computes it as a colocated engine would; 0: none."""

    @property
    def kv_link(self) -> KVLink:
        return KVLink(backend=self.backend, prefill_tp=self.prefill.tp, decode_tp=self.decode.tp)


@dataclass(frozen=True)
class Workload:
    rate: float
    requests: int = 100
    prompt_tokens: int = 2000
    output_tokens: int = 1000
    ignore_eos: bool = True
    seed: int = 0
    rescaled: bool = True
    """Arrivals as `vllm bench serve` sends them (the seed's tool): Poisson gaps rescaled so the last
    request goes out at requests/rate. False: a plain Poisson process."""
    prompt_mix: tuple[tuple[int, float], ...] = ()
    """A mixed workload: prompt lengths and their shares, e.g. ((200, 0.7), (4000, 0.3)), each request's
    length drawn from them; empty: every prompt has ``prompt_tokens``."""

    def prompt_lengths(self, count: int) -> list[int]:
        """Each request's prompt length, drawn from a stream of its own (arrivals and EOS stay as they were)."""
        if not self.prompt_mix:
            return [self.prompt_tokens] * count
        rng = random.Random(f"{self.seed}/{self.rate!r}/prompts")
        lengths, shares = zip(*self.prompt_mix, strict=True)
        return rng.choices(lengths, weights=shares, k=count)


@dataclass
class RequestResult:
    arrival: float
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival if self.token_times else math.inf

    @property
    def itl(self) -> float:
        """Per-request mean inter-token latency, (last - first) / (n - 1); 0 with fewer than 2 tokens."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n >= 2 else 0.0

    def good(self, ttft_slo: float, itl_slo: float) -> bool:
        return self.ttft < ttft_slo and self.itl < itl_slo


def poisson_arrivals(rate: float, count: int, rng: random.Random, rescaled: bool = False) -> list[float]:
    """The bench's Poisson arrivals; ``rescaled`` stretches them as `vllm bench serve` does (Workload)."""
    times = arrival_offsets(count, rate, Arrival.POISSON, rng)
    last = times[-1] if times else 0.0
    if rescaled and last > 0:
        span = count / rate
        times = [t * span / last for t in times]
    return times


def eos_length(mean: float, max_tokens: int, rng: random.Random) -> int:
    """Where EOS falls without ignore_eos: 2 + a geometric count (mean ``mean``), capped at max_tokens.

    Never the first token: that case is the ``--sim-eos-first-token`` knob.
    """
    if mean <= 0:
        return max_tokens
    p = 1.0 / max(mean, 1.0)
    draw = 2 + (int(math.log(1.0 - rng.random()) / math.log(1.0 - p)) if p < 1 else 0)
    return min(draw, max_tokens)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when, next(self._order), action))

    def run(self) -> None:
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            action()


TokenCallback = Callable[[TokenEvent, float], None]


class _Engine:
    """One engine on the virtual clock: steps back to back while the scheduler has work."""

    def __init__(self, clock: _Clock, profile: Profile, shape: EngineShape) -> None:
        self._clock = clock
        self._profile = profile
        self._tp = shape.tp
        self.scheduler = Scheduler(shape.max_batched_tokens, shape.max_num_seqs)
        self._busy = False
        self._on_token: dict[int, TokenCallback] = {}
        self._at_step_start: list[Callable[[], None]] = []
        self.first_scheduled: dict[int, float] = {}

    def at_next_step(self, action: Callable[[], None]) -> None:
        """Run ``action`` when the engine next starts a step (now, if it is idle): where vLLM's
        scheduler hands new work to the connector, so a read-mode pull starts there."""
        if self._busy:
            self._at_step_start.append(action)
        else:
            action()

    def submit(self, seq: Sequence, on_token: TokenCallback) -> None:
        self._on_token[id(seq)] = on_token
        self.scheduler.add(seq)
        self.kick()

    def kick(self) -> None:
        if self._busy:
            return
        for action in self._at_step_start:
            action()
        self._at_step_start.clear()
        step = self.scheduler.plan()
        if step is None:
            return
        self._busy = True
        for seq, _ in step.entries:
            self.first_scheduled.setdefault(id(seq), self._clock.now)
        duration = step_time(self._profile, self._tp, step.shape)
        self._clock.at(self._clock.now + duration, lambda: self._finish(step))

    def _finish(self, step: Step) -> None:
        self._busy = False
        for event in self.scheduler.commit(step):
            self._on_token[id(event.seq)](event, self._clock.now)
        self.kick()


def simulate(
    profile: Profile,
    topology: Topology,
    workload: Workload,
    lengths: list[int] | None = None,
    arrivals: list[float] | None = None,
) -> list[RequestResult]:
    """Run one open-loop stage and return each request's client-side token times.

    ``lengths`` overrides the output length of each request (e.g. the EOS positions a live engine
    drew for the same prompts), so a live run and the simulation can be compared request by request.
    ``arrivals`` overrides the send times (e.g. one arrival pattern scaled to several rates, as
    `vllm bench serve` draws it at every rate from the same ``--seed``).
    """
    rng = random.Random(f"{workload.seed}/{workload.rate!r}")
    drawn_arrivals = poisson_arrivals(workload.rate, workload.requests, rng, workload.rescaled)
    arrivals = drawn_arrivals if arrivals is None else arrivals
    eos_mean = 0.0 if workload.ignore_eos else profile.eos_mean_tokens
    drawn = [eos_length(eos_mean, workload.output_tokens, rng) for _ in arrivals]
    lengths = drawn if lengths is None else lengths
    clock = _Clock()
    results = [RequestResult(arrival=t) for t in arrivals]
    dispatch = _DISPATCHERS[topology.kind](clock, profile, topology)
    prompts = workload.prompt_lengths(len(arrivals))
    for index, (arrival, prompt, length) in enumerate(zip(arrivals, prompts, lengths, strict=True)):
        clock.at(arrival, _bind(dispatch, index, prompt, length, results[index]))
    clock.run()
    return results


Dispatch = Callable[[int, int, int, RequestResult], None]
"""Sends request ``index`` (its prompt tokens, its output tokens) and records its tokens in the result."""


def _bind(dispatch: Dispatch, index: int, prompt: int, length: int, result: RequestResult) -> Callable[[], None]:
    return lambda: dispatch(index, prompt, length, result)


def _record(clock: _Clock, result: RequestResult, delay: float) -> TokenCallback:
    return lambda event, when: result.token_times.append(when + delay)


def _plain(clock: _Clock, hop: float, engine: _Engine, seq: Sequence, result: RequestResult) -> None:
    """One plain request through the proxy to one engine, which computes its prompt and decodes."""
    clock.at(clock.now + hop, lambda: engine.submit(seq, _record(clock, result, 0.0)))


def _colocated(clock: _Clock, profile: Profile, topology: Topology) -> Dispatch:
    engines = [_Engine(clock, profile, topology.engine) for _ in range(topology.engines)]

    def dispatch(index: int, prompt: int, length: int, result: RequestResult) -> None:
        _plain(clock, profile.proxy_hop_s, engines[index % len(engines)], Sequence(str(index), prompt, length), result)

    return dispatch


def _disaggregated(clock: _Clock, profile: Profile, topology: Topology) -> Dispatch:
    prefills = [_Engine(clock, profile, topology.prefill) for _ in range(topology.prefills)]
    decodes = [_Engine(clock, profile, topology.decode) for _ in range(topology.decodes)]
    read_mode = topology.kind == "read"
    hop = profile.proxy_hop_s
    link = topology.kv_link
    transfer_times: dict[int, float] = {}

    def dispatch(index: int, prompt: int, length: int, result: RequestResult) -> None:
        prefill, decode = prefills[index % len(prefills)], decodes[index % len(decodes)]
        if prompt < topology.decode_alone_below:
            _plain(clock, hop, decode, Sequence(f"d{index}", prompt, length), result)
            return
        p_seq = Sequence(f"p{index}", prompt, 1)
        # our proxy's default max-tokens policy is exact: D generates the client's full length
        d_seq = Sequence(f"d{index}", prompt, length, ready=False)
        if prompt not in transfer_times:
            transfer_times[prompt] = kv_transfer_time(profile, prompt, link)
        whole_transfer = transfer_times[prompt]

        def landed() -> None:
            decode.scheduler.remote_kv_landed(d_seq)
            decode.kick()

        def prefill_done(event: TokenEvent, when: float) -> None:
            if read_mode:
                # proxy reads P's response, dispatches D; D's scheduler starts the pull when it next
                # schedules (its connector loads KV for requests the step admits), then the request waits
                def pull() -> None:
                    decode.submit(d_seq, _record(clock, result, 0.0))
                    decode.at_next_step(lambda: clock.at(clock.now + whole_transfer, landed))

                clock.at(when + 2 * hop, pull)
            else:
                started = prefill.first_scheduled.get(id(p_seq), when)
                tail = write_tail_time(profile, prompt, when - started, link)
                clock.at(when + tail, landed)

        clock.at(clock.now + hop, lambda: prefill.submit(p_seq, prefill_done))
        if not read_mode:
            clock.at(clock.now + hop, lambda: decode.submit(d_seq, _record(clock, result, 0.0)))

    return dispatch


_DISPATCHERS: dict[Kind, Callable[[_Clock, Profile, Topology], Dispatch]] = {
    "colocated": _colocated,
    "write": _disaggregated,
    "read": _disaggregated,
}


# The seed article's experiment (Qwen3-235B-A22B-FP8, 8x MI300X): its four configurations with the
# flags of its appendix, its workload and SLOs, and what it measured (goodput-and-proxy.md §1.9).
_COLOCATED = dict(max_batched_tokens=8192, max_num_seqs=1024)
SEED_TOPOLOGIES: dict[str, Topology] = {
    "1xTP8": Topology("colocated", engines=1, engine=EngineShape(tp=8, **_COLOCATED)),
    "2xTP4": Topology("colocated", engines=2, engine=EngineShape(tp=4, **_COLOCATED)),
    "read": Topology("read"),
    "write": Topology("write"),
}
SEED_TTFT_SLO_S = 1.0
SEED_ITL_SLO_S = 0.050
SEED_RATE = 8.0
SEED_GOOD_AT_RATE_8 = {"1xTP8": 26, "2xTP4": 29, "read": 70, "write": 73}
SEED_CURVE_POINTS = {
    "2xTP4": {0.5: 100.0, 1.0: 60.0, 2.0: 25.0},
    "read": {5.0: 100.0, 10.0: 44.0},
    "write": {5.5: 100.0, 10.0: 46.0},
}
# Every point of the seed's Figure 4 (rates 0.5, 1.0, ..., 10), read off the published chart
# (vllm-project.github.io assets/figures/2026-04-07-moriio-kv-connector/SLO-attainment.png).
SEED_FIGURE4_RATES = tuple(0.5 * i for i in range(1, 21))
SEED_FIGURE4: dict[str, tuple[int, ...]] = {
    "1xTP8": (78, 11, 13, 12, 13, 13, 13, 14, 16, 17, 20, 17, 17, 24, 25, 26, 26, 26, 27, 30),
    "2xTP4": (100, 57, 30, 22, 22, 22, 22, 23, 23, 22, 24, 25, 25, 25, 26, 29, 30, 30, 27, 29),
    "read": (100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 97, 92, 90, 80, 73, 70, 61, 56, 50, 44),
    "write": (100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 94, 91, 80, 77, 73, 62, 56, 50, 46),
}


def seed_workload(rate: float = SEED_RATE, seed: int = 0) -> Workload:
    """2000-token prompts, up to 1000 output tokens, 100 requests; `vllm bench serve` without
    --ignore-eos, so outputs end at EOS (see docs/simulator.md for why this matters)."""
    return Workload(rate=rate, requests=100, prompt_tokens=2000, output_tokens=1000, ignore_eos=False, seed=seed)


def good_count(profile: Profile, name: str, rate: float, seed: int) -> int:
    results = simulate(profile, SEED_TOPOLOGIES[name], seed_workload(rate, seed))
    return sum(r.good(SEED_TTFT_SLO_S, SEED_ITL_SLO_S) for r in results)


# `vllm bench serve` seeds its generator once (--seed, default 0) and draws the gaps as gamma variates
# scaled by 1/rate, then normalises them to end at requests/rate: a sweep that keeps the seed sends one
# arrival pattern at every rate, stretched. The seed's Figure 4 is such a sweep (its figure 3 shows the
# same TTFT bursts at the same request numbers in all four configurations). This is the pattern, among
# patterns 0-799, whose per-request TTFTs at 8 req/s come closest to the seed's figure 3 (write and read;
# `benchmarks/calibrate_sim.py pattern`, docs/simulator.md "Attainment vs rate").
SEED_ARRIVAL_PATTERN = 591


def pattern_run(profile: Profile, name: str, rate: float, pattern: int = SEED_ARRIVAL_PATTERN) -> list[RequestResult]:
    """One stage of a sweep that replays arrival pattern ``pattern`` (and its EOS positions) at ``rate``."""
    workload = seed_workload(rate, pattern)
    unit = poisson_arrivals(1.0, workload.requests, random.Random(f"{pattern}/pattern"), rescaled=True)
    rng = random.Random(f"{pattern}/lengths")
    lengths = [eos_length(profile.eos_mean_tokens, workload.output_tokens, rng) for _ in unit]
    return simulate(profile, SEED_TOPOLOGIES[name], workload, lengths, [t / rate for t in unit])


def pattern_good_count(profile: Profile, name: str, rate: float, pattern: int = SEED_ARRIVAL_PATTERN) -> int:
    return sum(r.good(SEED_TTFT_SLO_S, SEED_ITL_SLO_S) for r in pattern_run(profile, name, rate, pattern))
