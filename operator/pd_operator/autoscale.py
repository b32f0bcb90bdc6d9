"""Pure: replicas from demand against capacity (spec.autoscaling), decided once per reconcile.

Capacity is what one replica holds within the goodput probe's SLO: the last goodput search measured it
(``status.goodput.goodputRate``), else the planner predicted it for the layout. Demand is what the
replicas' proxies report over their window (arrivals per second, in flight, queued, the prompt and
output lengths they see). The raw recommendation is ``ceil(demand / (targetUtilization x capacity))``
within ``[minReplicas, maxReplicas]``; like a HorizontalPodAutoscaler, the operator scales up to the
lowest recommendation of the up window and down to the highest of the down window, so a burst shorter
than a window moves nothing. Two more rules are ours: replicas still starting count as coming (a 235B
engine loads for many minutes; scaling up again for the queue they leave would double-scale), and
scale-down goes one replica at a time and only while every replica is available, so serving never
drops below the PodDisruptionBudget's floor; the pod's deletion drains its proxy (SIGTERM: in-flight
answers finish, the Service stops sending it new ones).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pd_operator import autotune
from pd_operator.api import (
    AutoscalingSpec,
    CapacityStatus,
    DemandStatus,
    GoodputProbeSpec,
    GoodputStatus,
    PDDeploymentSpec,
    ScaleRecommendation,
)
from pd_operator.conditions import ScalingReason
from pd_operator.goodput import parse_time, rfc3339
from pd_operator.layout import Layout
from pd_runtime.plan.catalog import get_model
from pd_runtime.plan.layouts import NodeLayout
from pd_runtime.plan.price import Demand, sample

MAX_RECOMMENDATIONS = 64  # AutoscalingStatus.recommendations' max_length


@dataclass(frozen=True)
class ProxyDemand:
    """One replica proxy's report (its admin /status ``demand``): a window of arrivals and what they asked."""

    requests_per_second: float
    in_flight: int
    queued: int
    window_s: float
    prompt_requests: int = 0  # requests whose prompt length prefill reported (the mean's weight)
    prompt_tokens: int = 0  # summed over those
    output_requests: int = 0  # requests that named their output length
    output_tokens: int = 0
    arrivals: int | None = None  # the requests its window counted (None: an older proxy that does not say)

    @classmethod
    def from_status(cls, document: Mapping[str, Any]) -> ProxyDemand | None:
        """From a proxy's /status; None when it has no usable ``demand`` (an older proxy, a bad document)."""
        found = document.get("demand")
        if not isinstance(found, Mapping):
            return None
        try:
            prompt, output = found.get("prompt_tokens") or {}, found.get("output_tokens") or {}
            arrivals = found.get("arrivals")
            return cls(
                requests_per_second=max(0.0, float(found["requests_per_second"])),
                in_flight=max(0, int(found.get("in_flight", 0))),
                queued=max(0, int(found.get("queued", 0))),
                window_s=max(0.0, float(found.get("window_s", 0.0))),
                prompt_requests=max(0, int(prompt.get("requests", 0))),
                prompt_tokens=max(0, int(prompt.get("sum", 0))),
                output_requests=max(0, int(output.get("requests", 0))),
                output_tokens=max(0, int(output.get("sum", 0))),
                arrivals=None if arrivals is None else max(0, int(arrivals)),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def _mean(total: int, count: int) -> float | None:
    return round(total / count, 1) if count else None


def _rate(reports: Sequence[ProxyDemand]) -> float:
    """Every proxy's arrivals over the longest window, when they all count them; else their rates summed.

    A replica that started within the window (one just scaled up) divides its arrivals by its short life,
    while the others' windows still hold the time before it took its share: summed, their rates overstate
    demand for a whole window after every scale-up (by a tenth in the e2e ramp), enough to scale up again.
    """
    counted = [r.arrivals for r in reports if r.arrivals is not None]
    if len(counted) < len(reports):
        return sum(r.requests_per_second for r in reports)
    return sum(counted) / max(1.0, max(r.window_s for r in reports))


def demand(reports: Sequence[ProxyDemand], now: datetime) -> DemandStatus | None:
    """The replicas' reports summed (means weighted by their requests); None when no replica reported."""
    if not reports:
        return None
    rate = _rate(reports)
    return DemandStatus(
        requests_per_second=round(rate, 3),
        in_flight=sum(r.in_flight for r in reports),
        queued=sum(r.queued for r in reports),
        mean_prompt_tokens=_mean(sum(r.prompt_tokens for r in reports), sum(r.prompt_requests for r in reports)),
        mean_output_tokens=_mean(sum(r.output_tokens for r in reports), sum(r.output_requests for r in reports)),
        window_seconds=max(r.window_s for r in reports),
        replicas_reporting=len(reports),
        time=rfc3339(now),
        summary=f"{rate:.3g}/s",
    )


@dataclass(frozen=True)
class Predictions:
    """The planner's per-replica capacity (requests per second within the SLO), computed by the shell."""

    probe_workload: float | None  # at the goodput probe's prompt and output lengths
    live_workload: float | None  # at the lengths the proxies see now (None: not asked, or no prediction)


@dataclass(frozen=True)
class Query:
    """One prediction to make: the model on one replica's layout, a workload and SLO in model time."""

    model: str
    layout: NodeLayout
    demand: Demand
    time_scale: float  # simulated engines run this much faster: wall-clock rate = model-time rate x it


SEARCH_STEPS = 9
"""Simulated rates per prediction: doubling from 1 req/s (model time) until the SLO fails, then bisecting
(so at most 256 req/s of model time), one arrival sequence each."""
SEARCH_SECONDS = 20.0
"""Each simulated rate runs this long (model time, within 100 to ``SEARCH_MAX_REQUESTS`` requests): a
burst of the planner's 100 requests ends before the queue reaches its steady state and would overstate a
high rate."""
SEARCH_MAX_REQUESTS = 1000


def plan_layout(lay: Layout) -> NodeLayout | None:
    """One replica's layout as the planner models it: homogeneous engines per role, else None."""
    tps = {(e.role, e.tensor_parallel_size) for e in lay.engines}
    roles = Counter(e.role for e in lay.engines)
    if len(tps) != len(roles):  # a role with two tensor-parallel sizes: not a layout the planner prices
        return None
    tp = dict(tps)
    if set(roles) == {"engine"}:
        return NodeLayout("colocated", engines=roles["engine"], engine_tp=tp["engine"])
    if set(roles) == {"prefill", "decode"}:
        return NodeLayout("disaggregated", roles["prefill"], tp["prefill"], roles["decode"], tp["decode"])
    return None


def moved(spec: AutoscalingSpec, probe: GoodputProbeSpec, live: DemandStatus | None) -> bool:
    """Whether the workload the proxies see moved away from the probe's (``staleCapacityRatio``)."""
    return live is not None and (
        _shape_moved(spec.stale_capacity_ratio, float(probe.prompt_tokens), live.mean_prompt_tokens)
        or _shape_moved(spec.stale_capacity_ratio, float(probe.output_tokens), live.mean_output_tokens)
    )


def _bucket(tokens: float | None, default: int) -> int:
    """A live mean length to two significant digits: nearby means share one (cached) prediction."""
    return default if tokens is None else max(1, round(float(f"{tokens:.2g}")))


def queries(spec: PDDeploymentSpec, lay: Layout, live: DemandStatus | None) -> tuple[Query | None, Query | None]:
    """What to ask the planner: the probe's workload (its SLO is the one capacity is for, so none without a
    goodput probe), and the live workload only once it moved away from the probe's."""
    planned = plan_layout(lay)
    if not spec.autoscaling.enabled or not spec.goodput_probe.enabled or planned is None:
        return None, None
    base = autotune.demand(spec)
    probe = Query(spec.model, planned, base, autotune.model_time_scale(spec))
    if live is None or not moved(spec.autoscaling, spec.goodput_probe, live):
        return probe, None
    prompt = _bucket(live.mean_prompt_tokens, base.prompt_tokens)
    output = _bucket(live.mean_output_tokens, base.output_tokens)
    shaped = dataclasses.replace(base, prompt_tokens=prompt, output_tokens=output)
    return probe, dataclasses.replace(probe, demand=shaped)


@functools.lru_cache(maxsize=64)
def predict(query: Query) -> float | None:
    """The planner's capacity of one replica: the highest rate (wall-clock) at which the simulated layout
    meets the SLO target, by a doubling-then-bisecting search (``SEARCH_STEPS``); None when the model has
    no calibrated profile, does not fit, or misses the target even at the lowest rate tried.
    Deterministic (fixed arrival seeds), so cached; a new workload costs 0.2-2 s of CPU (long outputs
    cost most)."""
    try:
        model = get_model(query.model)
    except ValueError:
        return None
    if not autotune.fits(model, query.layout, query.demand):
        return None

    def meets(rate: float) -> bool:
        requests = min(SEARCH_MAX_REQUESTS, max(query.demand.requests, math.ceil(rate * SEARCH_SECONDS)))
        demand = dataclasses.replace(query.demand, requests=requests, seeds=1)
        return sample(model.profile, query.layout, demand, rate).point.attainment >= demand.target

    held, missed, rate = 0.0, math.inf, 1.0
    for _ in range(SEARCH_STEPS):
        if meets(rate):
            held = rate
        else:
            missed = rate
        rate = rate * 2 if missed == math.inf else (held + missed) / 2 if held else rate / 2
    return round(held * query.time_scale, 3) if held else None


def predictions(probe: Query | None, live: Query | None) -> Predictions:
    """Both predictions (the shell calls this off the event loop: a new workload costs a simulation)."""
    return Predictions(predict(probe) if probe else None, predict(live) if live else None)


def _shape_moved(ratio_limit: float, measured: float, live: float | None) -> bool:
    if live is None or measured <= 0 or live <= 0:
        return False
    return max(measured / live, live / measured) > ratio_limit


def capacity(
    spec: AutoscalingSpec,
    probe: GoodputProbeSpec,
    goodput: GoodputStatus | None,
    live: DemandStatus | None,
    predicted: Predictions,
    now: datetime,
) -> CapacityStatus | None:
    """Measured while the live workload looks like the probe's; once it moved, the prediction for the live
    workload scaled by how far measurement and prediction disagreed for the probe's (``scaled``), else the
    measured one marked stale; without a search result, predicted. Re-running the search would not help a
    moved workload: the probe measures the probe's lengths, not the live ones."""
    measured = goodput.goodput_rate if goodput is not None else None
    prompt, output = float(probe.prompt_tokens), float(probe.output_tokens)
    at = f"{prompt:g}/{output:g} tokens"
    if measured is not None and goodput is not None:
        if live is None or not moved(spec, probe, live):
            return _capacity(measured, "measured", prompt, output, goodput.time, f"goodput search at {at}")
        live_prompt, live_output = live.mean_prompt_tokens or prompt, live.mean_output_tokens or output
        shape = f"the workload moved to {live_prompt:g}/{live_output:g} tokens from the probe's {at}"
        if predicted.live_workload is not None and predicted.probe_workload:
            ratio = measured / predicted.probe_workload
            return _capacity(
                predicted.live_workload * ratio,
                "scaled",
                live_prompt,
                live_output,
                rfc3339(now),
                f"{shape}: the planner's {predicted.live_workload:.3g}/s for it x measured/predicted "
                f"{measured:.3g}/{predicted.probe_workload:.3g}",
                stale=True,
                ratio=ratio,
            )
        why = f"{shape}: kept the measured rate, the planner has no prediction for it"
        return _capacity(measured, "measured", prompt, output, goodput.time, why, stale=True)
    if predicted.probe_workload is not None:
        why = f"the planner's prediction for this layout at {at} (no goodput search result yet)"
        return _capacity(predicted.probe_workload, "predicted", prompt, output, rfc3339(now), why)
    return None


def _capacity(
    rate: float,
    source: Literal["measured", "predicted", "scaled"],
    prompt: float,
    output: float,
    at: str | None,
    message: str,
    *,
    stale: bool = False,
    ratio: float | None = None,
) -> CapacityStatus:
    return CapacityStatus(
        requests_per_second=round(rate, 3),
        source=source,
        prompt_tokens=prompt,
        output_tokens=output,
        time=at,
        stale=stale,
        measured_over_predicted=None if ratio is None else round(ratio, 3),
        message=message[:256],
        summary=f"{rate:.3g}/s {source}" + (" (stale)" if stale else ""),
    )


CAPACITY_REASONS = {
    ("measured", False): "CapacityMeasured",
    ("measured", True): "CapacityStale",
    ("scaled", True): "CapacityScaled",
    ("predicted", False): "CapacityPredicted",
}


def capacity_event(previous: CapacityStatus | None, new: CapacityStatus | None) -> tuple[str, str] | None:
    """(reason, message) of an Event when the capacity's basis changed (its source, or going stale)."""
    if new is None or (previous is not None and (previous.source, previous.stale) == (new.source, new.stale)):
        return None
    reason = CAPACITY_REASONS.get((new.source, new.stale), "CapacityChanged")
    return reason, f"capacity {new.requests_per_second:.3g} req/s per replica ({new.source}): {new.message}"


def recommend(spec: AutoscalingSpec, demand_rate: float, per_replica: float) -> int:
    """Replicas that keep each at or below targetUtilization of its capacity, within the bounds."""
    wanted = math.ceil(demand_rate / (spec.target_utilization * per_replica) - 1e-9) if per_replica > 0 else 0
    return min(spec.max_replicas, max(spec.min_replicas, wanted))


@dataclass(frozen=True)
class Replicas:
    """The replicas as the operator sees them this reconcile."""

    spec: int  # spec.replicas
    available: int  # serving: Ready and (disaggregated) KVTransferVerified
    hpa: str | None = None  # a HorizontalPodAutoscaler targeting this PDDeployment, by name


@dataclass(frozen=True)
class Verdict:
    """The decision: the replicas to write (None: leave spec.replicas), the condition, and an Event."""

    replicas: int | None
    status: Literal["True", "False"]
    reason: ScalingReason  # ScalingActive's
    message: str
    recommendations: tuple[ScaleRecommendation, ...]
    event: str | None = None  # a scaling decision's reason, for an Event
    advised: int | None = None  # with an HPA owning replicas: what the operator would write (published)

    def desired(self, current: int) -> int:
        """The replicas to publish: those written, else those advised to the HPA, else the current ones."""
        for found in (self.replicas, self.advised):
            if found is not None:
                return found
        return current


def _dated(history: Sequence[ScaleRecommendation], now: datetime) -> list[tuple[datetime, ScaleRecommendation]]:
    return [(t, r) for r in history if (t := parse_time(r.time)) is not None and t <= now]


def _window(history: Sequence[ScaleRecommendation], now: datetime, seconds: int, current: int) -> list[int]:
    """Every value the recommendation took in the last ``seconds``. The history is a step function (an
    entry holds from its time until the next one), so the value in force when the window opened counts;
    where the history does not reach back that far (a new PDDeployment, autoscaling just enabled), the
    time before it counts as ``current``."""
    since = now - timedelta(seconds=seconds)
    dated = _dated(history, now)
    opening = [r.replicas for t, r in dated if t <= since][-1:] or [current]
    return opening + [r.replicas for t, r in dated if t > since]


def _record(
    history: Sequence[ScaleRecommendation], now: datetime, keep_s: int, raw: int
) -> tuple[ScaleRecommendation, ...]:
    """The history with this reconcile's recommendation: a new entry only when the value changes, older
    entries only as far back as the longest window needs (the one in force when it opened), at most
    MAX_RECOMMENDATIONS (dropping the oldest only makes the windows more cautious)."""
    since = now - timedelta(seconds=keep_s)
    dated = _dated(history, now)
    kept = [r for t, r in dated if t <= since][-1:] + [r for t, r in dated if t > since]
    if not kept or kept[-1].replicas != raw:
        kept.append(ScaleRecommendation(time=rfc3339(now), replicas=raw))
    return tuple(kept[-MAX_RECOMMENDATIONS:])


def _why(spec: AutoscalingSpec, demand_rate: float, replicas: int, per_replica: float) -> str:
    held = spec.target_utilization * replicas * per_replica
    relation = ">" if demand_rate > held else "<="
    return (
        f"demand {demand_rate:.3g} req/s {relation} {spec.target_utilization:g} x {replicas} x {per_replica:.3g} req/s"
    )


def decide(
    spec: AutoscalingSpec,
    replicas: Replicas,
    live: DemandStatus | None,
    per_replica: CapacityStatus | None,
    history: Sequence[ScaleRecommendation],
    now: datetime,
) -> Verdict:
    """One reconcile's scaling decision (see the module docstring for the rules)."""
    if replicas.hpa is not None:  # decided as if the operator owned replicas, published for the HPA
        advice = decide(spec, dataclasses.replace(replicas, hpa=None), live, per_replica, history, now)
        advised = replicas.spec if advice.replicas is None else advice.replicas
        return Verdict(
            None,
            "False",
            "ReplicasOwnedElsewhere",
            f"HorizontalPodAutoscaler {replicas.hpa} targets this PDDeployment: it owns spec.replicas, so "
            f"autoscaling only publishes capacity, demand and desired replicas {advised} ({advice.reason})",
            advice.recommendations,
            advised=advised,
        )
    past = tuple(history)
    current = replicas.spec
    bounded = min(spec.max_replicas, max(spec.min_replicas, current))
    if bounded != current:  # the bounds are the user's word: kept whatever capacity and demand say
        message = f"replicas {current} outside [{spec.min_replicas}, {spec.max_replicas}]: {current} -> {bounded}"
        return Verdict(bounded, "True", "ScaledToBounds", message, past, event=message)
    if per_replica is None or per_replica.requests_per_second <= 0:
        return Verdict(
            None,
            "False",
            "NoCapacity",
            "no capacity yet: enable goodputProbe.search for a measured one, or the planner has no "
            "prediction for this layout",
            past,
        )
    if live is None:
        return Verdict(None, "False", "NoDemand", "no replica proxy reported its demand yet", past)
    rate, capacity_rate = live.requests_per_second, per_replica.requests_per_second
    raw = recommend(spec, rate, capacity_rate)
    keep_s = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds)
    recs = _record(history, now, keep_s, raw)
    up = min(_window(recs, now, spec.scale_up_stabilization_seconds, current))
    down = max(_window(recs, now, spec.scale_down_stabilization_seconds, current))
    why = _why(spec, rate, current, capacity_rate)
    if up > current:
        target, verb = up, "up"
    elif down < current:
        if replicas.available < current:
            return Verdict(
                None,
                "True",
                "WaitingForReplicas",
                f"{why}; scale-down waits until every replica is available ({replicas.available}/{current})",
                recs,
            )
        target, verb = current - 1, "down"
    else:
        held = "held by the stabilization windows" if raw != current else "within capacity"
        return Verdict(None, "True", "DemandWithinCapacity", f"{why}: {current} replicas, {held}", recs)
    message = f"{why}: replicas {current} -> {target}"
    return Verdict(target, "True", "ScaledUp" if verb == "up" else "ScaledDown", message, recs, event=message)
