"""Pure: live autotuning of the serving layout (``spec.autotune``).

The planner (``pdctl plan``'s core, ``pd_runtime.plan``, called as a library) prices the node's layouts
for the goodput probe's workload; the best few become trials. Each trial is the layout in force: the
spec with its layout replaced (mode, engines, GPUs, tensor parallelism), so the pod rolls as on a spec
change, and once it is Ready one goodput probe measures it. When every trial is measured, the best one
stays in force (:func:`best`). Everything here is a function of the spec and the stored
``status.autotune``; the planner's simulation is deterministic (fixed arrival seeds) and takes well under
a second, and it runs once per workload (``status.autotune.workload``), off the operator's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pd_operator.api import AutotuneStatus, AutotuneTrial, GoodputStatus, PDDeploymentSpec
from pd_operator.observe import Event, merge_patch
from pd_operator.validation import validate_spec
from pd_runtime.plan import emit
from pd_runtime.plan.catalog import MI300X, ModelSpec, get_model
from pd_runtime.plan.layouts import NodeLayout, layouts, memory_fit
from pd_runtime.plan.price import Demand, assemble, sample
from pd_runtime.plan.rank import rank

PLAN_REQUESTS = 100
"""Requests per simulated run, as `pdctl plan`'s default (a probe's few requests swing too much to plan by)."""
PLAN_SEEDS = 2
ENGINE_KEEP = ("env", "extraArgs", "resources", "shmSize", "gpuMemoryUtilization", "enablePrefixCaching", "maxModelLen")
"""Engine settings of the user's spec that every trial's engines keep; the planner's layout sets the rest."""
LAYOUT_KEYS = ("mode", "prefill", "decode", "colocated", "kvTransfer")
"""The spec fields a layout decides: what `pdctl autotune accept` writes."""
Obj = dict[str, Any]


def model_time_scale(spec: PDDeploymentSpec) -> float:
    """Simulated engines run ``timeScale`` times faster: the probe's rate and SLOs are scaled by it."""
    return spec.simulation.time_scale if spec.engine == "simulated" else 1.0


def demand(spec: PDDeploymentSpec) -> Demand:
    """The probe's workload in model time, as the planner takes it."""
    g, scale = spec.goodput_probe, model_time_scale(spec)
    rate = g.rate / scale
    return Demand(
        rate=rate,
        rates=(rate,),
        prompt_tokens=g.prompt_tokens,
        output_tokens=g.output_tokens,
        ttft_slo_s=g.slo.ttft_ms * scale / 1000,
        itl_slo_s=g.slo.itl_ms * scale / 1000,
        target=g.slo.target,
        requests=PLAN_REQUESTS,
        seeds=PLAN_SEEDS,
        ignore_eos=g.ignore_eos,
    )


def workload_key(spec: PDDeploymentSpec) -> str:
    """What the trials depend on; a change starts autotuning over."""
    g = spec.goodput_probe
    return (
        f"{spec.model} {g.rate:g} req/s {g.prompt_tokens}/{g.output_tokens} tokens "
        f"TTFT {g.slo.ttft_ms:g} ms ITL {g.slo.itl_ms:g} ms target {g.slo.target:g}{'' if g.ignore_eos else ' EOS'} "
        f"on {spec.node.gpus_per_node} GPUs, {spec.autotune.max_trials} trials"
    )[:256]


def pick(kinds: Sequence[str], budget: int) -> list[int]:
    """Indices of the ranked layouts to try: the top ``budget``, except that with a budget of 2 or more the
    best layout of the other kind (colocated or disaggregated) takes the last place, so that the planner's
    least certain call, whether to disaggregate at all, is measured rather than assumed."""
    chosen = list(range(min(budget, len(kinds))))
    if budget < 2 or not kinds:
        return chosen
    other = next((i for i, k in enumerate(kinds) if k != kinds[0]), None)
    if other is not None and other not in chosen:
        chosen[-1] = other
    return chosen


def fits(model: ModelSpec, lay: NodeLayout, wanted: Demand) -> bool:
    """Whether every engine of the layout holds the model and the KV of the workload's requests."""
    return all(
        f.fits for f in memory_fit(model, MI300X, lay, wanted.requests, wanted.prompt_tokens, wanted.output_tokens)
    )


def plan_trials(spec: PDDeploymentSpec) -> list[AutotuneTrial]:
    """The trials for the spec's workload: the node's layouts the API runs and the model fits, ranked by the
    planner at the probe's rate. Raises ValueError when the model has no calibrated profile."""
    model, wanted = get_model(spec.model), demand(spec)
    feasible = [lay for lay in _layouts(spec) if emit.supported(lay) and fits(model, lay, wanted)]
    ranked = rank(
        [assemble(lay, wanted, [], sample(model.profile, lay, wanted, wanted.rate)) for lay in feasible], wanted.target
    )
    chosen = [ranked[i] for i in pick([p.layout.kind for p in ranked], spec.autotune.max_trials)]
    return [
        AutotuneTrial(
            layout=p.layout.name,
            kind=p.layout.kind,
            gpus=p.layout.gpus,
            predicted_attainment=round(p.at_rate.attainment, 3),
        )
        for p in chosen
    ]


# ---- the spec in force ------------------------------------------------------------------------------------


def _layouts(spec: PDDeploymentSpec) -> list[NodeLayout]:
    """The node's layouts the spec's vLLM runs: a TP change between prefill and decode only from 0.33."""
    return layouts(spec.node.gpus_per_node, mixed_tp=spec.vllm_release.heterogeneous_tp_write)


def _plan_layout(spec: PDDeploymentSpec, name: str) -> NodeLayout:
    found = {lay.name: lay for lay in _layouts(spec)}
    if name not in found:
        raise ValueError(f"layout {name!r} does not use the node's {spec.node.gpus_per_node} GPUs")
    return found[name]


def _engine_base(wire: Obj) -> Obj:
    """The user's engine settings that no layout decides (resources, /dev/shm, env, extra args)."""
    first = wire["prefill"] if wire["mode"] == "disaggregated" else wire["colocated"]["engines"][0]
    return {k: first[k] for k in ENGINE_KEEP if k in first}


def layout_spec(spec: PDDeploymentSpec, name: str) -> PDDeploymentSpec:
    """The spec with its layout replaced by the planner's layout ``name`` (write mode when disaggregated);
    everything else (image, probe, proxy, simulation, per-engine resources and arguments) stays."""
    planned = emit.manifest(_plan_layout(spec, name), spec.model, demand(spec), vllm_version=spec.vllm_version)["spec"]
    wire = spec.model_dump(by_alias=True, mode="json")
    base = _engine_base(wire)
    wire["mode"] = planned["mode"]
    if planned["mode"] == "colocated":
        wire["colocated"] = {"engines": [{**base, **engine} for engine in planned["colocated"]["engines"]]}
    else:
        for role in ("prefill", "decode"):
            wire[role] = {**base, **planned[role]}
        wire["kvTransfer"] = {**wire["kvTransfer"], "transferMode": planned["kvTransfer"]["transferMode"]}
    return PDDeploymentSpec.model_validate(wire)


def spec_in_force(spec: PDDeploymentSpec, state: AutotuneStatus | None) -> PDDeploymentSpec:
    """The spec the serving pod runs: the spec's own layout unless a trial or the tuned result overrides it."""
    if not spec.autotune.enabled or state is None or state.layout_in_force is None:
        return spec
    try:
        return layout_spec(spec, state.layout_in_force)
    except ValueError:  # the spec changed since planning so that the layout no longer validates with it
        return spec


# ---- trials ---------------------------------------------------------------------------------------------


def current(state: AutotuneStatus) -> AutotuneTrial | None:
    """The first trial not measured yet."""
    return next((t for t in state.trials if t.attainment is None and t.error is None), None)


def best(trials: Sequence[AutotuneTrial], target: float) -> AutotuneTrial:
    """The best measured trial. Trials that meet the target tie with each other (the SLO is what the user
    asked for; more headroom is not worth more GPUs or a KV transfer): fewer GPUs, then colocated, then
    higher attainment. Below the target, higher attainment wins, then the same tie-breaks."""

    def key(t: AutotuneTrial) -> tuple[float, ...]:
        attainment = t.attainment or 0.0
        meets = attainment >= target
        return (not meets, 0.0 if meets else -attainment, t.gpus, t.kind != "colocated", -attainment)

    return min(trials, key=key)


@dataclass(frozen=True)
class Step:
    state: AutotuneStatus | None
    events: tuple[Event, ...] = ()


def _started(state: AutotuneStatus, trial: AutotuneTrial) -> Event:
    number = state.trials.index(trial) + 1
    return Event(
        "Normal",
        "AutotuneTrialStarted",
        f"trial {number}/{len(state.trials)}: serving with {trial.layout} "
        f"(planner: {trial.predicted_attainment:.0%} attainment)",
    )


def plan_due(spec: PDDeploymentSpec, previous: AutotuneStatus | None) -> bool:
    """Whether this spec's workload has no trials yet (autotuning just enabled, or the workload changed)."""
    return spec.autotune.enabled and (previous is None or previous.workload != workload_key(spec))


@dataclass(frozen=True)
class Plan:
    """The trials planned for one workload, or why none could be. Planning takes 0.3-0.7 s of CPU, so the
    operator's shell runs :func:`plan` off its event loop, once per reconcile, and the core reads the result."""

    workload: str
    trials: tuple[AutotuneTrial, ...] = ()
    error: str | None = None


def plan(spec: PDDeploymentSpec) -> Plan:
    """The trials for the spec's workload, each checked to give a valid spec."""
    key = workload_key(spec)
    try:
        trials = plan_trials(spec)
        for trial in trials:
            layout_spec(spec, trial.layout)
        if not trials:
            raise ValueError(f"no layout of the node's {spec.node.gpus_per_node} GPUs fits the model")
    except ValueError as exc:
        return Plan(key, error=f"cannot plan the trials: {exc}"[:1024])
    return Plan(key, tuple(trials))


def begin(spec: PDDeploymentSpec, previous: AutotuneStatus | None, planned: Plan | None) -> Step:
    """Autotuning's state for this spec: kept while the workload is the same, else started from ``planned``,
    the :func:`plan` of this workload (given whenever :func:`plan_due`)."""
    if not spec.autotune.enabled:
        return Step(None)
    if not plan_due(spec, previous):
        return Step(previous)
    key = workload_key(spec)
    assert planned is not None and planned.workload == key, "plan() runs before deciding, whenever plan_due()"
    if planned.error is not None:
        failed = AutotuneStatus(workload=key, message=planned.error)
        return Step(failed, (Event("Warning", "AutotuneFailed", planned.error),))
    trials = list(planned.trials)
    state = AutotuneStatus(workload=key, trials=trials, layout_in_force=trials[0].layout)
    state = state.model_copy(update={"message": f"trial 1 of {len(trials)}: {trials[0].layout}"})
    return Step(state, (_started(state, trials[0]),))


def record(state: AutotuneStatus, result: GoodputStatus | None, error: str | None, now: str, target: float) -> Step:
    """A trial's probe finished: its measurement (or why none) into the trial, then the next trial in force,
    or, after the last, the best measured layout."""
    trial = current(state)
    if trial is None or state.probing != trial.layout:
        return Step(state.model_copy(update={"probing": None}))
    if result is not None:
        update: Obj = {
            "attainment": round(result.attainment, 4),
            "goodput": round(result.attainment * result.rate, 4),
            "met": result.met,
            "time": result.time,
        }
    else:
        update = {"attainment": 0.0, "goodput": 0.0, "met": False, "time": now, "error": (error or "no result")[:1024]}
    measured = trial.model_copy(update=update)
    trials = [measured if t is trial else t for t in state.trials]
    number = state.trials.index(trial) + 1
    detail = f"error: {measured.error}" if measured.error else f"attainment {measured.attainment:.0%}"
    events = [
        Event(
            "Warning" if measured.error else "Normal",
            "AutotuneTrialMeasured",
            f"trial {number}/{len(trials)} {measured.layout}: {detail}, goodput {measured.goodput:g} req/s "
            f"(planner: {measured.predicted_attainment:.0%})",
        )
    ]
    state = state.model_copy(update={"trials": trials, "probing": None})
    following = current(state)
    if following is not None:
        message = f"trial {number + 1} of {len(trials)}: {following.layout}"
        state = state.model_copy(update={"layout_in_force": following.layout, "message": message})
        return Step(state, (*events, _started(state, following)))
    chosen = best(trials, target)
    message = f"tuned: {chosen.layout} is the best of {len(trials)} trials (attainment {chosen.attainment:.0%})"
    state = state.model_copy(update={"layout_in_force": chosen.layout, "tuned": chosen.layout, "message": message})
    return Step(state, (*events, Event("Normal", "Tuned", message)))


def probe_due(state: AutotuneStatus | None) -> bool:
    """A trial waits for its measurement and no trial probe runs."""
    return state is not None and state.probing is None and current(state) is not None


def accept_patch(stored_spec: Mapping[str, Any], state: AutotuneStatus | None) -> Obj:
    """The JSON merge patch of .spec that pins the tuned layout into the spec and turns autotuning off
    (``pdctl autotune accept``): the layout fields become the tuned layout's, nothing else changes."""
    if state is None or state.tuned is None:
        raise ValueError("no tuned layout yet: status.autotune.tuned is empty (trials still run, or none planned)")
    tuned = layout_spec(validate_spec(stored_spec), state.tuned).model_dump(
        by_alias=True, mode="json", exclude_defaults=True
    )
    desired = {k: v for k, v in stored_spec.items() if k not in LAYOUT_KEYS}
    desired |= {k: tuned[k] for k in LAYOUT_KEYS if k in tuned}
    desired["autotune"] = {**stored_spec.get("autotune", {}), "enabled": False}
    return merge_patch(stored_spec, desired)
