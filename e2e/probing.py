"""Run one probe attempt the way the kubelet does: HTTP GET and TCP from the node to the pod IP (an
httpGet ``host`` from the node's host network namespace, where the kubelet runs), exec inside.

Success rules follow the kubelet: HTTP 200-399, a TCP connection that opens, an exec that exits 0; a probe
that does not answer within timeoutSeconds fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import httpx

from e2e.netns import run_in_netns
from e2e.podspec import Probe


async def probe_once(
    probe: Probe, pod_ip: str, pid: int | None, env: dict[str, str], node_netns: str | None = None
) -> tuple[bool, str]:
    """One attempt; returns (success, detail for events and logs). ``node_netns``: the node's host
    network namespace (None: the agent's own is the node's)."""
    try:
        if probe.kind == "httpGet" and probe.host and node_netns is not None:
            return await run_in_netns(node_netns, lambda: _http_sync(probe))
        if probe.kind == "httpGet":
            return await _http(probe, probe.host or pod_ip)
        if probe.kind == "tcpSocket":
            return await _tcp(probe, pod_ip)
        return await _exec(probe, pid, env)
    except (TimeoutError, OSError, httpx.HTTPError) as err:
        return False, f"{probe.kind} failed: {type(err).__name__}: {err}"


def _request(probe: Probe, host: str) -> tuple[str, dict[str, str]]:
    scheme = "https" if probe.scheme.upper() == "HTTPS" else "http"
    return f"{scheme}://{host}:{probe.port}{probe.path}", {"User-Agent": "kube-probe/1.36", **dict(probe.headers)}


def _verdict(url: str, status: int) -> tuple[bool, str]:
    return 200 <= status < 400, f"HTTP probe {url}: status {status}"


async def _http(probe: Probe, host: str) -> tuple[bool, str]:
    url, headers = _request(probe, host)
    async with httpx.AsyncClient(verify=False, trust_env=False) as client:
        resp = await client.get(url, headers=headers, timeout=probe.timeout_s)
    return _verdict(url, resp.status_code)


def _http_sync(probe: Probe) -> tuple[bool, str]:
    """The same GET on the calling thread (one that entered the node's network namespace)."""
    url, headers = _request(probe, probe.host)
    with httpx.Client(verify=False, trust_env=False) as client:
        resp = client.get(url, headers=headers, timeout=probe.timeout_s)
    return _verdict(url, resp.status_code)


async def _tcp(probe: Probe, pod_ip: str) -> tuple[bool, str]:
    _, writer = await asyncio.wait_for(asyncio.open_connection(pod_ip, probe.port), probe.timeout_s)
    writer.close()
    return True, f"TCP probe {pod_ip}:{probe.port} connected"


async def _exec(probe: Probe, pid: int | None, env: dict[str, str]) -> tuple[bool, str]:
    if pid is None:
        return False, "exec probe: container not running"
    code, tail = await exec_in_container(probe.command, pid, env, probe.timeout_s)
    if code is None:
        return False, f"exec probe {list(probe.command)} timed out after {probe.timeout_s}s"
    return code == 0, f"exec probe {list(probe.command)} exited {code}: {tail}"


async def exec_in_container(
    command: tuple[str, ...] | list[str], pid: int, env: dict[str, str], timeout_s: float
) -> tuple[int | None, str]:
    """Run ``command`` in the mount and network namespaces of the container whose process is ``pid``
    with its environment, as the kubelet runs exec probes and hooks; (exit code or None when killed at
    ``timeout_s``, the output's tail)."""
    argv = ["nsenter", "--target", str(pid), "--mount", "--net", "--", *command]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return None, ""
    return proc.returncode, out.decode(errors="replace").strip()[-200:]
