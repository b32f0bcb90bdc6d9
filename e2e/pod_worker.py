"""The kubelet's job for one pod: sandbox, init containers, containers as processes, probes, restarts, status.

One PodWorker per pod UID. Containers are supervised concurrently; every state change marks the status
dirty and a single writer task sends it as a strategic-merge patch of pods/status (carrying the UID, so a
stale worker can never write onto a new pod that reuses the name).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import configmaps, devices, podspec
from e2e.devices import Allocation, AllocationError, DeviceManager, NodeDevices
from e2e.kubeapi import ApiError, KubeClient
from e2e.netns import PodNetwork
from e2e.podspec import ConfigError, Obj, PodFacts, Probe
from e2e.probing import exec_in_container, probe_once
from e2e.sandbox import MountPoints, PodSandbox

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 4096
FALLBACK_LOG_LIMIT = 2048
MINIMUM_GRACE_AFTER_HOOK_S = 2.0  # the kubelet's one-off extension when a preStop hook used up the grace


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeContext:
    """What every pod worker shares with the agent."""

    api: KubeClient
    node_name: str
    host_ip: str
    pods_dir: Path
    node_devices: NodeDevices  # its root is the node's filesystem: hostPath volumes and device nodes
    device_manager: DeviceManager
    mount_points: MountPoints
    base_env: dict[str, str]
    network: PodNetwork | None
    status_only: bool = False
    backoff_base_s: float = 1.0
    backoff_max_s: float = 20.0
    keep_files: bool = False
    on_network_change: Callable[[], None] = lambda: None
    post_event: Callable[[Obj, str, str, str, str], Coroutine[Any, Any, None]] | None = None
    fake_ips: itertools.count[int] = field(default_factory=lambda: itertools.count(2))


@dataclass
class Container:
    """Runtime state of one container, rendered into a containerStatus."""

    spec: Obj
    init: bool = False
    restart_count: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    process: asyncio.subprocess.Process | None = None
    env: dict[str, str] = field(default_factory=dict)
    run_started: float = 0.0
    crashes: int = 0

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self, pod_uid: str) -> Obj:
        status: Obj = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if "waiting" not in self.state:
            status["containerID"] = f"pd-e2e://{pod_uid[:8]}-{self.name}-{self.restart_count}"
        return status


def should_restart(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def exit_code_of(returncode: int) -> int:
    """asyncio reports death by signal N as -N; a container runtime reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class PodWorker:
    """Runs one pod to completion or deletion."""

    def __init__(self, ctx: NodeContext, pod: Obj) -> None:
        self.ctx = ctx
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.name: str = pod["metadata"]["name"]
        self.namespace: str = pod["metadata"]["namespace"]
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy", "Always")
        self.inits = [Container(c, init=True) for c in spec.get("initContainers", [])]
        self.containers = [Container(c) for c in spec["containers"]]
        self.phase = "Pending"
        self.pod_ip = ""
        self.start_time = now_iso()
        self.initialized = not self.inits
        self.sandbox_ready = False
        self.stopping = False
        self.finished = asyncio.Event()
        self._conditions: dict[str, tuple[str, str]] = {}
        self._dirty = asyncio.Event()
        self._last_sent: Obj | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._refs: podspec.Refs = {}
        self._devices: dict[str, Allocation] = {}
        self._admission_error = ""
        self._main: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        root = ctx.pods_dir / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.sandbox = PodSandbox(root, ctx.mount_points, ctx.node_devices.root)

    # ---- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._writer = asyncio.create_task(self._status_writer(), name=f"status {self.name}")
        self._main = asyncio.create_task(self._run(), name=f"pod {self.name}")

    @property
    def ready(self) -> bool:
        return self.phase == "Running" and all(c.ready for c in self.containers)

    def update(self, pod: Obj) -> None:
        self.pod = pod

    async def _run(self) -> None:
        try:
            if self.ctx.status_only:
                await self._run_status_only()
                return
            if not self._allocate_devices():
                await self._finish("Failed")
                return
            await self._prepare()
            if not await self._run_inits():
                await self._finish("Failed")
                return
            self._tasks = [asyncio.create_task(self._supervise(c)) for c in self.containers]
            await asyncio.gather(*self._tasks)
            if not self.stopping:
                failed = any(c.state.get("terminated", {}).get("exitCode", 0) != 0 for c in self.containers)
                await self._finish("Failed" if failed else "Succeeded")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s/%s: worker crashed", self.namespace, self.name)
            await self._finish("Failed")

    async def _run_status_only(self) -> None:
        """Benchmark mode: no processes, the pod is Running and Ready at once.

        Its address is on loopback (127.214.x.y): whoever dials it gets "connection refused" at once,
        and no packet leaves the machine."""
        self.pod_ip = f"127.214.{(n := next(self.ctx.fake_ips)) // 250 % 250}.{n % 250 + 2}"
        self.sandbox_ready = True
        self.phase = "Running"
        stamp = now_iso()
        for c in self.containers:
            c.state, c.ready, c.started = {"running": {"startedAt": stamp}}, True, True
        self.mark_dirty()

    def _allocate_devices(self) -> bool:
        """The device manager's part of pod admission: a pod whose devices are not free is rejected."""
        containers = [*self.pod["spec"].get("initContainers", []), *self.pod["spec"]["containers"]]
        requests = {c["name"]: devices.device_requests(c) for c in containers}
        try:
            self._devices = self.ctx.device_manager.allocate(self.uid, requests)
        except AllocationError as err:
            self._admission_error = str(err)
            self._event("UnexpectedAdmissionError", str(err), "Warning")
            return False
        return True

    async def _prepare(self) -> None:
        """Network namespace and volumes; config errors are retried, as the kubelet does."""
        self.sandbox.root.mkdir(parents=True, exist_ok=True)
        if self.ctx.network is None:
            self.pod_ip = self.ctx.host_ip
        elif self.pod["spec"].get("hostNetwork"):
            self.sandbox.netns, self.pod_ip = self.ctx.network.node_netns, self.ctx.host_ip
        else:
            self.sandbox.netns, self.pod_ip = await self.ctx.network.add_pod(self.uid)
        self.sandbox.write_resolv_conf(self.namespace)
        self.sandbox.write_hosts("")
        self.sandbox_ready = True
        self.ctx.on_network_change()  # writes this pod's hosts file before any container starts
        self.mark_dirty()
        while True:
            try:
                refs = await self._fetch_refs()
                plans = podspec.plan_volumes(self.pod, refs, self._facts())
                await self.sandbox.create_volumes(plans, self._fetch_token)
                self._refs = refs
                self._start_volume_refresh()
                return
            except (ConfigError, ApiError) as err:
                self._config_error(str(err))
                await asyncio.sleep(2)

    def _start_volume_refresh(self) -> None:
        """Mounted ConfigMaps and Secrets follow their objects, as the kubelet's periodic sync does."""
        refresher = configmaps.VolumeRefresher(
            self._fetch_refs, lambda refs: podspec.plan_volumes(self.pod, refs, self._facts()), self.sandbox.volumes
        )
        self._refresher = asyncio.create_task(refresher.run(), name=f"volumes {self.name}")

    def _config_error(self, message: str) -> None:
        for c in [*self.inits, *self.containers]:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
        self.mark_dirty()
        self._event("Failed", f"Error: {message}", "Warning")

    def _facts(self) -> PodFacts:
        return PodFacts(pod_ip=self.pod_ip, host_ip=self.ctx.host_ip)

    async def _fetch_refs(self) -> dict[tuple[str, str, str], dict[str, str] | None]:
        refs: dict[tuple[str, str, str], dict[str, str] | None] = {}
        for kind, namespace, name in podspec.referenced_objects(self.pod):
            plural = "configmaps" if kind == "ConfigMap" else "secrets"
            obj = await self.ctx.api.get_or_none(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
            if obj is None:
                refs[(kind, namespace, name)] = None
            elif kind == "Secret":
                refs[(kind, namespace, name)] = podspec.decode_secret(obj)
            else:
                refs[(kind, namespace, name)] = dict(obj.get("data") or {})
        return refs

    async def _fetch_token(self, audience: str, expiration_s: int) -> str:
        account = self.pod["spec"].get("serviceAccountName", "default")
        spec: Obj = {"expirationSeconds": max(expiration_s, 600)}
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token"
        result = await self.ctx.api.create(path, body)
        return str(result["status"]["token"])

    async def _run_inits(self) -> bool:
        for c in self.inits:
            while not self.stopping:
                code = await self._run_once(c)
                if code == 0:
                    break
                if self.restart_policy == "Never":
                    return False
                await self._backoff(c)
        self.initialized = True
        self.mark_dirty()
        return not self.stopping

    async def _supervise(self, c: Container) -> None:
        policy = c.spec.get("restartPolicy", self.restart_policy)  # sidecars may override
        while not self.stopping:
            code = await self._run_once(c)
            if self.stopping or not should_restart(policy, code):
                return
            await self._backoff(c)

    async def _backoff(self, c: Container) -> None:
        """Exponential back-off over consecutive quick crashes; a run longer than a minute resets it."""
        c.crashes = 0 if time.monotonic() - c.run_started > 60 else c.crashes + 1
        delay = min(self.ctx.backoff_base_s * 2 ** max(c.crashes - 1, 0), self.ctx.backoff_max_s)
        reason = f"back-off {delay:.0f}s restarting failed container={c.name} pod={self.name}_{self.namespace}"
        c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": reason}}
        self.mark_dirty()
        self._event("BackOff", f"Back-off restarting failed container {c.name}", "Warning")
        await asyncio.sleep(delay)
        c.restart_count += 1

    async def _run_once(self, c: Container) -> int:
        """Start the container, probe it, wait for it to exit; returns the exit code (1: not startable)."""
        try:
            c.env = {**self.ctx.base_env, **podspec.resolve_env(self.pod, c.spec, self._refs, self._facts())}
            c.env["PD_TERMINATION_LOG"] = "/dev/termination-log"
            c.env.setdefault("HOSTNAME", self.name)
            argv = podspec.resolve_argv(c.spec, c.env)
            mounts = podspec.plan_mounts(c.spec)
            self.sandbox.termination_file(c.name).write_text("")  # a fresh message file per run
            privileged = bool((c.spec.get("securityContext") or {}).get("privileged"))
            view = devices.container_view(self.ctx.node_devices, self._devices.get(c.name, Allocation()), privileged)
            sys_class = self.sandbox.sys_class_dir(c.name, self.ctx.node_devices, view.allocation)
            launch = self.sandbox.launch_argv(c.name, mounts, argv, c.spec.get("workingDir", ""), view, sys_class)
        except ConfigError as err:
            self._config_error(str(err))
            await asyncio.sleep(2)
            return 1
        log_path = self._rotate_logs(c)
        with log_path.open("ab") as out:
            c.process = await asyncio.create_subprocess_exec(
                *launch,
                env=c.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        (self.sandbox.container_dir(c.name) / "pid").write_text(str(c.process.pid))  # tests kill by pid
        c.run_started = time.monotonic()
        started_at = now_iso()
        c.state = {"running": {"startedAt": started_at}}
        c.started = c.init or not c.spec.get("startupProbe")
        c.ready = False
        self._event("Started", f"Started container {c.name}")
        if not c.init:
            self.phase = "Running"
        self.mark_dirty()
        probes = asyncio.create_task(self._probe_container(c)) if not c.init else None
        returncode = await c.process.wait()
        if probes is not None:
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes
        code = exit_code_of(returncode)
        c.ready = False
        c.started = False
        c.last_state = {}
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": now_iso(),
            "containerID": f"pd-e2e://{self.uid[:8]}-{c.name}-{c.restart_count}",
        }
        if message := self._termination_message(c, code, log_path):
            terminated["message"] = message
        c.state = {"terminated": terminated}
        c.last_state = {"terminated": terminated}
        c.process = None
        log.info("pod %s/%s container %s exited %d", self.namespace, self.name, c.name, code)
        self.mark_dirty()
        return code

    def _rotate_logs(self, c: Container) -> Path:
        directory = self.sandbox.container_dir(c.name)
        current = directory / "current.log"
        if current.exists():
            current.replace(directory / "previous.log")
        return current

    def _termination_message(self, c: Container, code: int, log_path: Path) -> str:
        text = self.sandbox.termination_file(c.name).read_text(errors="replace")[:MESSAGE_LIMIT]
        fallback = c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        if not text and fallback and code != 0 and log_path.exists():
            lines = log_path.read_text(errors="replace").splitlines()[-80:]
            text = "\n".join(lines)[-FALLBACK_LOG_LIMIT:]
        return text

    # ---- probes ----------------------------------------------------------------------------------------

    async def _probe_container(self, c: Container) -> None:
        startup = podspec.parse_probe(c.spec, c.spec.get("startupProbe"))
        readiness = podspec.parse_probe(c.spec, c.spec.get("readinessProbe"))
        liveness = podspec.parse_probe(c.spec, c.spec.get("livenessProbe"))
        if startup is not None:
            if not await self._probe_until(c, startup, "Startup"):
                await self._kill(c, "failed startup probe, will be restarted")
                return
            c.started = True
            self.mark_dirty()
        loops = [self._readiness_loop(c, readiness)]
        if liveness is not None:
            loops.append(self._liveness_loop(c, liveness))
        await asyncio.gather(*loops)

    async def _attempt(self, c: Container, probe: Probe) -> tuple[bool, str]:
        pid = c.process.pid if c.process else None
        node_netns = self.ctx.network.node_netns if self.ctx.network is not None else None
        return await probe_once(probe, self.pod_ip, pid, c.env, node_netns)

    async def _probe_until(self, c: Container, probe: Probe, what: str) -> bool:
        """Startup probe: True after successThreshold successes, False after failureThreshold failures."""
        await asyncio.sleep(probe.initial_delay_s)
        failures = 0
        while True:
            ok, detail = await self._attempt(c, probe)
            if ok:
                return True
            failures += 1
            if failures >= probe.failure_threshold:
                self._event("Unhealthy", f"{what} probe failed: {detail}", "Warning")
                return False
            await asyncio.sleep(probe.period_s)

    async def _readiness_loop(self, c: Container, probe: Probe | None) -> None:
        if probe is None:
            c.ready = True
            self.mark_dirty()
            return
        await asyncio.sleep(probe.initial_delay_s)
        successes = failures = 0
        while True:
            ok, detail = await self._attempt(c, probe)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            ready = c.ready
            if successes >= probe.success_threshold:
                ready = True
            elif failures >= probe.failure_threshold:
                ready = False
            if ready != c.ready:
                c.ready = ready
                self.mark_dirty()
                if not ready:
                    self._event("Unhealthy", f"Readiness probe failed: {detail}", "Warning")
            await asyncio.sleep(probe.period_s)

    async def _liveness_loop(self, c: Container, probe: Probe) -> None:
        await asyncio.sleep(probe.initial_delay_s)
        failures = 0
        while True:
            ok, detail = await self._attempt(c, probe)
            failures = 0 if ok else failures + 1
            if failures >= probe.failure_threshold:
                self._event("Unhealthy", f"Liveness probe failed: {detail}", "Warning")
                await self._kill(c, "failed liveness probe, will be restarted")
                return
            await asyncio.sleep(probe.period_s)

    async def _kill(self, c: Container, why: str) -> None:
        self._event("Killing", f"Container {c.name} {why}")
        await self._terminate(c, self._grace_s())

    def _grace_s(self) -> float:
        meta_grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        spec_grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(meta_grace if meta_grace is not None else spec_grace)

    async def _terminate(self, c: Container, grace_s: float) -> None:
        """As the kubelet: the preStop hook first (its time counts against the grace period), SIGTERM
        when it ends, SIGKILL at the end of the grace (at least 2 s after SIGTERM once a hook ran).
        SIGTERM goes to the container's main process only, as a container runtime sends it to PID 1;
        once that has exited, what is left of the container (its process group) gets SIGKILL, as the
        kernel kills a PID namespace whose init is gone."""
        process = c.process
        if process is None or process.returncode is not None:
            return
        hook = podspec.pre_stop_command(c.spec)
        if hook is not None and grace_s > 0:
            started = time.monotonic()
            await self._pre_stop(c, process.pid, hook, grace_s)
            grace_s = max(grace_s - (time.monotonic() - started), MINIMUM_GRACE_AFTER_HOOK_S)
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()

    async def _pre_stop(self, c: Container, pid: int, hook: list[str], budget_s: float) -> None:
        """Run the container's preStop exec hook in its namespaces, for at most the grace period."""
        log.info("pod %s/%s container %s: preStop %s", self.namespace, self.name, c.name, hook)
        try:
            code, tail = await exec_in_container(hook, pid, c.env, budget_s)
        except OSError as err:
            code, tail = -1, str(err)
        if code != 0:
            detail = f"timed out after {budget_s:g}s" if code is None else f"exited {code}: {tail}"
            self._event("FailedPreStopHook", f"PreStopHook {hook} for container {c.name} {detail}", "Warning")

    # ---- stop and finish -------------------------------------------------------------------------------

    async def stop(self, grace_s: float | None = None) -> None:
        """Kill all containers (SIGTERM, then SIGKILL after the grace period) and release the sandbox."""
        if self.stopping:
            await self.finished.wait()
            return
        self.stopping = True
        grace = self._grace_s() if grace_s is None else grace_s
        if grace > 0 and self.inits + self.containers:
            self._event("Killing", "Stopping containers")
        await asyncio.gather(*(self._terminate(c, grace) for c in [*self.inits, *self.containers]))
        for task in [self._main, *self._tasks, self._refresher]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._release()
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        self.finished.set()

    async def _release(self) -> None:
        self.ctx.device_manager.release(self.uid)
        if self.sandbox_ready and self.ctx.network is not None:
            await self.ctx.network.remove_pod(self.uid)
        self.sandbox_ready = False
        self.ctx.on_network_change()
        await self.sandbox.destroy(keep_files=self.ctx.keep_files)

    async def _finish(self, phase: str) -> None:
        """All containers are done and will not restart: the pod is terminal; its sandbox goes away."""
        self.phase = phase
        for c in self.containers:
            c.ready = False
        self.ctx.device_manager.release(self.uid)  # a terminal pod's devices go back to the node
        if self.ctx.network is not None and self.sandbox.netns:
            await self.ctx.network.remove_pod(self.uid)
            self.sandbox.netns = ""
        self.ctx.on_network_change()
        self.mark_dirty()

    # ---- status ----------------------------------------------------------------------------------------

    def mark_dirty(self) -> None:
        self._dirty.set()

    def _condition(self, kind: str, ok: bool, reason: str = "") -> Obj:
        status = "True" if ok else "False"
        previous = self._conditions.get(kind)
        if previous is None or previous[0] != status:
            self._conditions[kind] = (status, now_iso())
        condition: Obj = {"type": kind, "status": status, "lastTransitionTime": self._conditions[kind][1]}
        condition["lastProbeTime"] = None
        # explicit nulls: a strategic merge patch would otherwise keep a stale reason from before
        condition["reason"] = reason if reason and not ok else None
        return condition

    def compose_status(self) -> Obj:
        ready = self.ready
        terminal = self.phase in ("Succeeded", "Failed")
        not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        status: Obj = {
            "phase": self.phase,
            "hostIP": self.ctx.host_ip,
            "hostIPs": [{"ip": self.ctx.host_ip}],
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.sandbox_ready or terminal),
                self._condition("Initialized", self.initialized, "ContainersNotInitialized"),
                self._condition("ContainersReady", ready, not_ready_reason),
                self._condition("Ready", ready, not_ready_reason),
            ],
            "containerStatuses": [c.status(self.uid) for c in self.containers],
        }
        if self.inits:
            status["initContainerStatuses"] = [c.status(self.uid) for c in self.inits]
        if self._admission_error:
            status |= {"reason": "UnexpectedAdmissionError", "message": self._admission_error}
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        return status

    async def _status_writer(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status"
        while True:
            await self._dirty.wait()
            await asyncio.sleep(0.05)  # coalesce bursts of changes into one patch
            self._dirty.clear()
            status = self.compose_status()
            if status == self._last_sent:
                continue
            try:
                await self.ctx.api.patch(path, {"metadata": {"uid": self.uid}, "status": status})
                self._last_sent = status
            except ApiError as err:
                if err.status in (404, 409):
                    return  # the pod is gone, or the name now belongs to a new pod
                log.warning("pod %s/%s: status patch failed: %s", self.namespace, self.name, err)
                await asyncio.sleep(1)
                self._dirty.set()
            except Exception as err:
                log.warning("pod %s/%s: status patch failed: %s", self.namespace, self.name, err)
                await asyncio.sleep(1)
                self._dirty.set()

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        if self.ctx.post_event is not None:
            task = asyncio.create_task(self.ctx.post_event(self.pod, reason, message, kind, ""))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
