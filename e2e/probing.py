"""Run one probe attempt the way the kubelet does: HTTP GET and TCP from the node to the pod IP, exec inside.

Success rules follow the kubelet: HTTP 200-399, a TCP connection that opens, an exec that exits 0; a probe
that does not answer within timeoutSeconds fails.
"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx

from e2e.podspec import Probe


async def probe_once(probe: Probe, pod_ip: str, pid: int | None, env: dict[str, str]) -> tuple[bool, str]:
    """One attempt; returns (success, detail for events and logs)."""
    try:
        if probe.kind == "httpGet":
            return await _http(probe, pod_ip)
        if probe.kind == "tcpSocket":
            return await _tcp(probe, pod_ip)
        return await _exec(probe, pid, env)
    except (TimeoutError, OSError, httpx.HTTPError) as err:
        return False, f"{probe.kind} failed: {type(err).__name__}: {err}"


async def _http(probe: Probe, pod_ip: str) -> tuple[bool, str]:
    scheme = "https" if probe.scheme.upper() == "HTTPS" else "http"
    url = f"{scheme}://{pod_ip}:{probe.port}{probe.path}"
    headers = {"User-Agent": "kube-probe/1.36", **dict(probe.headers)}
    async with httpx.AsyncClient(verify=False, trust_env=False) as client:
        resp = await client.get(url, headers=headers, timeout=probe.timeout_s)
    ok = 200 <= resp.status_code < 400
    return ok, f"HTTP probe {url}: status {resp.status_code}"


async def _tcp(probe: Probe, pod_ip: str) -> tuple[bool, str]:
    _, writer = await asyncio.wait_for(asyncio.open_connection(pod_ip, probe.port), probe.timeout_s)
    writer.close()
    return True, f"TCP probe {pod_ip}:{probe.port} connected"


async def _exec(probe: Probe, pid: int | None, env: dict[str, str]) -> tuple[bool, str]:
    if pid is None:
        return False, "exec probe: container not running"
    argv = ["nsenter", "--target", str(pid), "--mount", "--net", "--", *probe.command]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), probe.timeout_s)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return False, f"exec probe {list(probe.command)} timed out after {probe.timeout_s}s"
    tail = out.decode(errors="replace").strip()[-200:]
    return proc.returncode == 0, f"exec probe {list(probe.command)} exited {proc.returncode}: {tail}"
