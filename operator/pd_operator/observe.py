"""Pure: what the operator sees (spec, pod, proxy /status, probe result) -> the PDDeployment status.

Nothing here talks to the API server. The handlers gather a :class:`Snapshot` and apply the status
this module computes, plus the Events for the transitions between the old and the new status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pd_operator.api import PDDeploymentSpec, Phase
from pd_operator.engine_cmd import engine_containers
from pd_operator.render import PROXY_CONTAINER, gpu_devices_pinned, gpus_reserved

Obj = dict[str, Any]
CRASH_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)
MESSAGE_LIMIT = 1024
# `pdctl engine` exits with this code (EX_CONFIG) when its preflight refuses to start the engine; its
# reason is the container's termination message (pd_runtime.launcher.EXIT_PREFLIGHT_FAILED).
PREFLIGHT_EXIT_CODE = 78
PREFLIGHT_FAILED = "PreflightFailed"


@dataclass(frozen=True)
class ProxyReport:
    """The proxy admin ``GET /status`` document (contract 3), or why it could not be read."""

    status: Mapping[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the status is computed from; ``previous`` is the current status (camelCase)."""

    generation: int
    now: str
    spec: PDDeploymentSpec | None
    spec_problems: Sequence[str] = ()
    pod: Mapping[str, Any] | None = None
    pod_current: bool = True
    pod_error: str | None = None  # why the serving pod could not be created or deleted
    proxy: ProxyReport | None = None
    previous: Mapping[str, Any] = field(default_factory=dict)
    goodput: Mapping[str, Any] | None = None  # a fresh probe result; None keeps the previous one


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


# ---- containers ------------------------------------------------------------------------------------------


def _expected_containers(spec: PDDeploymentSpec) -> list[tuple[str, str]]:
    """(container name, role) of the serving pod."""
    return [(e.name, e.role) for e in engine_containers(spec)] + [(PROXY_CONTAINER, "proxy")]


def _state(cs: Mapping[str, Any]) -> tuple[str, str, str]:
    """(state, reason, message) of a containerStatus. While it waits to restart, the last termination's
    message says why it ended; the kubelet's back-off note says only when it retries."""
    state = cs.get("state") or {}
    last = (cs.get("lastState") or {}).get("terminated") or {}
    for kind in ("waiting", "running", "terminated"):
        if kind in state:
            detail = state[kind] or {}
            first, second = (last, detail) if kind == "waiting" else (detail, last)
            message = first.get("message") or second.get("message") or ""
            reason = detail.get("reason") or ("" if kind == "running" else last.get("reason", ""))
            return kind, str(reason), str(message)[:MESSAGE_LIMIT]
    return "unknown", "", ""


def _gpus(spec: PDDeploymentSpec, name: str) -> Obj | None:
    eng = next((e for e in engine_containers(spec) if e.name == name), None)
    if eng is None:
        return None
    if not gpus_reserved(spec):
        return {"count": 0}
    gpus: Obj = {"count": len(eng.gpus)}
    if gpu_devices_pinned(spec):
        gpus["devices"] = eng.settings.gpus
    return gpus


def preflight_failures(pod: Mapping[str, Any] | None) -> dict[str, str]:
    """Container name -> the launcher's refusal, for engines whose latest run ended in a failed preflight."""
    found = {}
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        ended = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        if ended.get("exitCode") == PREFLIGHT_EXIT_CODE:
            found[str(cs.get("name"))] = str(ended.get("message") or "the engine preflight failed")
    return found


def role_statuses(spec: PDDeploymentSpec, pod: Mapping[str, Any] | None) -> list[Obj]:
    statuses = {cs.get("name"): cs for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []}
    out = []
    for name, role in _expected_containers(spec):
        cs = statuses.get(name, {})
        state, reason, message = _state(cs)
        entry: Obj = {
            "name": name,
            "role": role,
            "ready": bool(cs.get("ready")),
            "started": bool(cs.get("started")),
            "restartCount": int(cs.get("restartCount") or 0),
            "state": state,
            "reason": reason,
            "message": message,
        }
        gpus = _gpus(spec, name)
        if gpus is not None:
            entry["gpus"] = gpus
        out.append(entry)
    return out


def gpu_assignment(spec: PDDeploymentSpec) -> Obj:
    strategy = spec.gpu_allocation.strategy if gpus_reserved(spec) else "none"
    engines = engine_containers(spec)

    def shown(gpus: str, count: int) -> str:
        if strategy == "none":
            return "-"
        return gpus if strategy in ("hostDevices", "dra") else f"{count} (plugin-chosen)"

    cells = {e.name: shown(e.settings.gpus, len(e.gpus)) for e in engines}
    notes = {
        "devicePlugin": "the device plugin chose the devices; each container sees its GPUs as 0..N-1",
        "hostDevices": "pinned to physical indices through CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES",
        "dra": "pinned by the ResourceClaimTemplate's device selectors",
        "none": "simulated engines reserve no GPUs",
    }
    out: Obj = {"strategy": strategy, "note": notes[strategy]}
    if spec.mode == "colocated":
        out |= {"prefill": "-", "decode": "-", "engines": [cells[e.name] for e in engines]}
    else:
        out |= {"prefill": cells["prefill"], "decode": cells["decode"]}
    return out


# ---- phase ------------------------------------------------------------------------------------------------


def _pod_condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def _trouble(roles: Sequence[Mapping[str, Any]]) -> list[str]:
    """Containers that crashed or cannot start, with their reason and last message."""
    found = []
    for r in roles:
        crashed = r["reason"] in CRASH_REASONS or (r["restartCount"] > 0 and not r["ready"])
        if crashed:
            detail = f": {r['message']}" if r["message"] else ""
            found.append(f"{r['name']} {r['reason'] or 'restarted'} (restarts {r['restartCount']}){detail}")
    return found


def phase_of(snap: Snapshot, roles: Sequence[Mapping[str, Any]]) -> tuple[Phase, str]:
    if snap.spec is None:
        return "Failed", "invalid spec: " + "; ".join(snap.spec_problems)
    pod = snap.pod
    if snap.pod_error:
        return ("Pending" if pod is None else "Progressing"), snap.pod_error
    if pod is None:
        return "Pending", "creating the serving pod"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Progressing", "the serving pod is terminating"
    if not snap.pod_current:
        return "Progressing", "rolling the serving pod to the new spec"
    pod_phase = (pod.get("status") or {}).get("phase")
    if pod_phase in ("Failed", "Succeeded"):
        reason = (pod.get("status") or {}).get("reason") or pod_phase
        return "Failed", f"the serving pod ended ({reason}); it will be recreated"
    scheduled = _pod_condition(pod, "PodScheduled")
    if scheduled.get("status") != "True":
        return "Pending", scheduled.get("message") or "waiting for the scheduler"
    if roles and all(r["ready"] for r in roles):
        return "Ready", "all containers are ready"
    trouble = _trouble(roles)
    if trouble:
        return "Degraded", "; ".join(trouble)[:MESSAGE_LIMIT]
    waiting = [r["name"] for r in roles if not r["ready"]]
    return "Progressing", "waiting for " + ", ".join(waiting)


# ---- conditions -------------------------------------------------------------------------------------------


def _condition(kind: str, ok: bool | None, reason: str, message: str) -> Obj:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return {"type": kind, "status": status, "reason": reason, "message": message[:MESSAGE_LIMIT]}


def _ready_condition(
    kind: str, names: Sequence[str], roles: Sequence[Mapping[str, Any]], pod: bool, preflight: Mapping[str, str]
) -> Obj:
    if not pod:
        return _condition(kind, False, "NoPod", "the serving pod does not exist yet")
    refused = [f"{name}: {preflight[name].strip()}" for name in names if name in preflight]
    if refused:
        return _condition(kind, False, PREFLIGHT_FAILED, "; ".join(refused))
    mine = [r for r in roles if r["name"] in names]
    not_ready = [r["name"] for r in mine if not r["ready"]]
    if not not_ready:
        return _condition(kind, True, "ContainersReady", ", ".join(names) + " ready")
    return _condition(kind, False, "ContainersNotReady", "not ready: " + ", ".join(not_ready))


def _same_pod(snap: Snapshot) -> bool:
    return same_pod(snap.previous, snap.pod)


def same_pod(previous: Mapping[str, Any], pod: Mapping[str, Any] | None) -> bool:
    uid = ((pod or {}).get("metadata") or {}).get("uid")
    return bool(uid) and uid == previous.get("podUid")


def kv_transfer_verified(previous: Mapping[str, Any], pod: Mapping[str, Any] | None) -> bool:
    """Already verified for this very pod: no need to ask the proxy again."""
    kv: Mapping[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == "KVTransferVerified"), {}
    )
    return kv.get("status") == "True" and same_pod(previous, pod)


def kv_transfer_condition(snap: Snapshot, previous: Mapping[str, Any] | None) -> Obj:
    """True once the proxy saw one transfer id succeed on both legs; sticky for the life of the pod."""
    kind = "KVTransferVerified"
    assert snap.spec is not None
    if snap.spec.mode == "colocated":
        return _condition(kind, None, "NotApplicable", "colocated mode moves no KV cache between engines")
    if previous and previous.get("status") == "True" and _same_pod(snap):
        return dict(previous)
    report = snap.proxy
    if report is None or snap.pod is None:
        return _condition(kind, False, "NoProxy", "the proxy is not running yet")
    if report.status is None:
        return _condition(kind, False, "ProxyUnreachable", f"proxy admin /status: {report.error}")
    last = report.status.get("last_transfer")
    if not isinstance(last, Mapping):
        return _condition(
            kind, False, "NoTransferYet", "waiting for a request whose prefill and decode legs both succeed"
        )
    message = (
        f"transfer {last.get('transfer_id')} from prefill {last.get('prefill')} to decode {last.get('decode')} "
        f"completed at {last.get('completed_at')} ({last.get('source')})"
    )
    return _condition(kind, True, "TransferCompleted", message)


def goodput_condition(spec: PDDeploymentSpec, goodput: Mapping[str, Any] | None) -> Obj:
    kind = "GoodputMet"
    if not spec.goodput_probe.enabled:
        return _condition(kind, None, "ProbeDisabled", "spec.goodputProbe.enabled is false")
    if not goodput:
        return _condition(kind, None, "NoProbeYet", "the first probe runs once the deployment is Ready")
    slo = goodput["slo"]
    message = (
        f"attainment {goodput['attainment']:.3f} at {goodput['rate']:g} req/s "
        f"(TTFT <= {slo['ttftMs']:g} ms, ITL <= {slo['itlMs']:g} ms), target {slo['target']:g}"
    )
    met = bool(goodput["met"])
    return _condition(kind, met, "TargetMet" if met else "TargetMissed", message)


def _with_transition_times(new: list[Obj], old: Sequence[Mapping[str, Any]], now: str, generation: int) -> list[Obj]:
    before = {c.get("type"): c for c in old}
    for cond in new:
        prior = before.get(cond["type"])
        same = prior is not None and prior.get("status") == cond["status"]
        cond["lastTransitionTime"] = prior.get("lastTransitionTime", now) if same and prior else now
        cond["observedGeneration"] = generation
    return new


def conditions(snap: Snapshot, roles: Sequence[Mapping[str, Any]], phase: Phase, goodput: Obj | None) -> list[Obj]:
    old = list(snap.previous.get("conditions") or [])
    if snap.spec is None:
        invalid = _condition("SpecValid", False, "InvalidSpec", "; ".join(snap.spec_problems))
        kept = [dict(c) for c in old if c.get("type") != "SpecValid"]
        return _with_transition_times([invalid, *kept], old, snap.now, snap.generation)
    spec, pod = snap.spec, snap.pod is not None
    refused = preflight_failures(snap.pod)
    conds = [_condition("SpecValid", True, "Valid", "the spec passed validation")]
    if spec.mode == "disaggregated":
        conds += [
            _ready_condition("PrefillReady", ["prefill"], roles, pod, refused),
            _ready_condition("DecodeReady", ["decode"], roles, pod, refused),
        ]
    else:
        engines = [e.name for e in engine_containers(spec)]
        conds.append(_ready_condition("EngineReady", engines, roles, pod, refused))
    conds.append(_ready_condition("ProxyReady", [PROXY_CONTAINER], roles, pod, refused))
    conds.append(_condition("Ready", phase == "Ready", phase, "serving" if phase == "Ready" else "not serving"))
    previous_kv = next((c for c in old if c.get("type") == "KVTransferVerified"), None)
    conds.append(kv_transfer_condition(snap, previous_kv))
    conds.append(goodput_condition(spec, goodput))
    return _with_transition_times(conds, old, snap.now, snap.generation)


# ---- the pod -------------------------------------------------------------------------------------------------

PodAction = Literal["create", "keep", "replace", "roll", "wait"]


def pod_action(live: Mapping[str, Any] | None, desired: Mapping[str, Any], hash_key: str) -> PodAction:
    """What to do with the serving pod: create it, keep it, wait for it to go, or delete it to recreate."""
    if live is None:
        return "create"
    meta = live.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "wait"
    if (live.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return "replace"
    wanted = desired["metadata"]["annotations"][hash_key]
    return "keep" if (meta.get("annotations") or {}).get(hash_key) == wanted else "roll"


# ---- status and events --------------------------------------------------------------------------------------


def status(snap: Snapshot) -> Obj:
    """The status fields the operator owns (goodput and probe bookkeeping are kept as they are)."""
    goodput = dict(snap.goodput or snap.previous.get("goodput") or {}) or None
    if snap.spec is None:
        phase, message = phase_of(snap, [])
        out: Obj = {"phase": phase, "message": message[:MESSAGE_LIMIT]}
        out["conditions"] = conditions(snap, [], phase, goodput)
        return out
    roles = role_statuses(snap.spec, snap.pod)
    phase, message = phase_of(snap, roles)
    pod = snap.pod or {}
    meta, pod_status = pod.get("metadata") or {}, pod.get("status") or {}
    out = {
        "phase": phase,
        "message": message[:MESSAGE_LIMIT],
        "ready": f"{sum(r['ready'] for r in roles)}/{len(roles)}",
        "transfer": snap.spec.kv_transfer.transfer_mode if snap.spec.mode == "disaggregated" else "none",
        "podName": meta.get("name"),
        "podUid": meta.get("uid"),
        "podIP": pod_status.get("podIP"),
        "nodeName": (pod.get("spec") or {}).get("nodeName"),
        "roles": roles,
        "gpuAssignment": gpu_assignment(snap.spec),
        "conditions": conditions(snap, roles, phase, goodput),
    }
    if snap.pod_current and snap.pod is not None:
        out["observedGeneration"] = snap.generation
    return out


_PHASE_EVENT: dict[str, Literal["Normal", "Warning"]] = {
    "Pending": "Normal",
    "Progressing": "Normal",
    "Ready": "Normal",
    "Degraded": "Warning",
    "Failed": "Warning",
}


def events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events for a phase change and for condition flips that matter to users."""
    found: list[Event] = []
    phase = new.get("phase")
    if phase and phase != old.get("phase"):
        found.append(Event(_PHASE_EVENT[phase], phase, str(new.get("message", ""))))
    before = {c.get("type"): c.get("status") for c in old.get("conditions") or []}
    reasons_before = {c.get("type"): c.get("reason") for c in old.get("conditions") or []}
    for cond in new.get("conditions") or []:
        kind, value = cond["type"], cond["status"]
        if cond.get("reason") == PREFLIGHT_FAILED and reasons_before.get(kind) != PREFLIGHT_FAILED:
            found.append(Event("Warning", PREFLIGHT_FAILED, cond["message"]))
        if before.get(kind) == value or value == "Unknown":
            continue
        if kind == "SpecValid" and value == "False":
            found.append(Event("Warning", "InvalidSpec", cond["message"]))
        elif kind == "KVTransferVerified" and value == "True":
            found.append(Event("Normal", "KVTransferVerified", cond["message"]))
        elif kind == "GoodputMet":
            reason = "GoodputMet" if value == "True" else "GoodputMissed"
            found.append(Event("Normal" if value == "True" else "Warning", reason, cond["message"]))
    return found
