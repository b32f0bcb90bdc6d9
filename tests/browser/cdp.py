"""Open a page in real headless Chromium over the DevTools protocol and report what a person would see
go wrong: uncaught exceptions, console errors, failed loads; then evaluate an expression in the page."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

DEVTOOLS_LINE = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("chromium is not installed: run tests/browser/ensure-chromium.sh (make unit does)")


@dataclass
class PageReport:
    errors: list[str] = field(default_factory=list)
    value: Any = None


async def open_page(path: Path, expression: str, timeout_s: float = 60.0) -> PageReport:
    # Chromium's helper processes can still write into the profile after the browser exits: a leftover
    # file there must not turn a passing page check into an error
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        args = [
            chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
        ]  # fmt: skip
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=os.environ | {"LANG": "C"})
        try:
            browser_ws = await asyncio.wait_for(asyncio.to_thread(_devtools_url, proc), timeout_s)
            return await asyncio.wait_for(_inspect(browser_ws, path.resolve().as_uri(), expression), timeout_s)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _devtools_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stderr is not None
    for raw in proc.stderr:
        match = DEVTOOLS_LINE.search(raw.decode(errors="replace"))
        if match:
            return match.group(1)
    raise RuntimeError(f"chromium exited ({proc.wait()}) without a DevTools endpoint")


async def _inspect(browser_ws: str, url: str, expression: str) -> PageReport:
    report = PageReport()
    ids = itertools.count(1)
    http_root = browser_ws.split("/devtools/")[0].replace("ws://", "http://")
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{http_root}/json/new?about:blank") as resp:
            page_ws = (await resp.json())["webSocketDebuggerUrl"]
        async with session.ws_connect(page_ws, max_msg_size=0) as ws:

            async def call(method: str, **params: Any) -> dict[str, Any]:
                call_id = next(ids)
                await ws.send_json({"id": call_id, "method": method, "params": params})
                while True:
                    message = json.loads((await ws.receive()).data)
                    if message.get("id") == call_id:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        result: dict[str, Any] = message.get("result", {})
                        return result
                    _collect(message, report)

            for domain in ("Runtime", "Log", "Page", "Network"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            while True:
                message = json.loads((await ws.receive()).data)
                _collect(message, report)
                if message.get("method") == "Page.loadEventFired":
                    break
            result = await call("Runtime.evaluate", expression=expression, returnByValue=True)
            if "exceptionDetails" in result:
                report.errors.append(f"evaluate: {result['exceptionDetails']}")
            report.value = result.get("result", {}).get("value")
    return report


def _collect(message: dict[str, Any], report: PageReport) -> None:
    method, params = message.get("method"), message.get("params", {})
    if method == "Runtime.exceptionThrown":
        report.errors.append(f"exception: {params['exceptionDetails'].get('text')}")
    elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        report.errors.append(f"console.{params['type']}: {params.get('args')}")
    elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
        report.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
    elif method == "Network.loadingFailed":
        report.errors.append(f"load failed: {params.get('errorText')}")
