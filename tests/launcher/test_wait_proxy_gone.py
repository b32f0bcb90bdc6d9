"""`pdctl wait-proxy-gone`: the verdict (pure), and the wait against a real HTTP /status on loopback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pd_runtime import wait_proxy_gone
from pd_runtime.wait_proxy_gone import Look, Verdict, look, verdict, wait


def test_verdict() -> None:
    assert verdict(Look.GONE, 0, 10, 3) is Verdict.GONE
    assert verdict(Look.GONE, 99, 10, 3) is Verdict.GONE
    assert verdict(Look.LEAVING, 9.9, 10, 3) is Verdict.WAIT
    assert verdict(Look.LEAVING, 10, 10, 3) is Verdict.GAVE_UP
    assert verdict(Look.SERVING, 2.9, 10, 3) is Verdict.WAIT  # its SIGTERM may not have arrived yet
    assert verdict(Look.SERVING, 3, 10, 3) is Verdict.STAYS
    assert verdict(Look.UNKNOWN, 9, 10, 3) is Verdict.WAIT
    assert verdict(Look.UNKNOWN, 0, 0, 3) is Verdict.GAVE_UP


class FakeProxy:
    """A real HTTP server answering /status like the proxy's admin port."""

    def __init__(self, admin_key: str | None = None) -> None:
        self.leaving = False
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"leaving": proxy.leaving, "in_flight": 0}).encode()
                keyed = admin_key is None or self.headers.get("Authorization") == f"Bearer {admin_key}"
                self.send_response((200 if keyed else 401) if self.path == "/status" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def proxy() -> Iterator[FakeProxy]:
    p = FakeProxy()
    yield p
    if p.thread.is_alive():
        p.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_look(proxy: FakeProxy) -> None:
    assert look(proxy.port, 5) is Look.SERVING
    proxy.leaving = True
    assert look(proxy.port, 5) is Look.LEAVING
    proxy.close()
    assert look(proxy.port, 5) is Look.GONE


def test_look_sends_the_admin_key_a_host_network_proxy_asks_for() -> None:
    keyed = FakeProxy(admin_key="k")
    try:
        assert look(keyed.port, 5) is Look.UNKNOWN
        keyed.leaving = True
        assert look(keyed.port, 5, admin_key="k") is Look.LEAVING
    finally:
        keyed.close()


def test_look_goes_straight_to_loopback_whatever_proxy_the_environment_names(
    proxy: FakeProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine's env may carry http_proxy (for model downloads): through it, a refused connect would read
    as the pod's proxy gone and the engine would stop at once."""
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert look(proxy.port, 5) is Look.SERVING


def test_a_listener_that_does_not_speak_http_is_unknown() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        assert look(sock.getsockname()[1], 0.2) is Look.UNKNOWN  # accepted by the kernel, never answered


def test_a_port_nobody_listens_on_is_gone_at_once() -> None:
    looks: list[float] = []
    assert wait(_closed_port(), 60, 0.01, 3, sleep=looks.append) is Verdict.GONE
    assert looks == []


def test_waits_while_leaving_until_the_proxy_closes(proxy: FakeProxy) -> None:
    """The proxy closes after the third look: the wait returns on the fourth, in virtual time."""
    proxy.leaving = True
    looks: list[float] = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 3:
            proxy.close()

    assert wait(proxy.port, 60, 0.5, 3, clock=lambda: 0.0, sleep=sleep) is Verdict.GONE
    assert looks == [0.5, 0.5, 0.5]


def test_a_proxy_that_stays_serving_lets_the_engine_restart(proxy: FakeProxy) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert wait(proxy.port, 60, 0.5, 3, clock=lambda: now[0], sleep=sleep) is Verdict.STAYS
    assert now[0] == pytest.approx(3.0)


def test_a_proxy_that_starts_leaving_is_waited_for(proxy: FakeProxy) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        proxy.leaving = True  # its SIGTERM arrived after the first look

    assert wait(proxy.port, 1.2, 0.5, 0.3, clock=lambda: now[0], sleep=sleep) is Verdict.GAVE_UP
    assert now[0] == pytest.approx(1.2)  # the last sleep is cut to the time left


def test_main_returns_when_the_proxy_closes(proxy: FakeProxy, caplog: pytest.LogCaptureFixture) -> None:
    proxy.leaving = True
    closer = threading.Timer(0.3, proxy.close)
    closer.start()
    try:
        with caplog.at_level("INFO", logger=wait_proxy_gone.__name__):
            assert wait_proxy_gone.main(["--port", str(proxy.port), "--timeout", "120", "--interval", "0.05"]) == 0
    finally:
        closer.join()
    assert "is gone" in caplog.text


def test_main_gives_up_and_still_exits_zero(proxy: FakeProxy, caplog: pytest.LogCaptureFixture) -> None:
    proxy.leaving = True
    with caplog.at_level("INFO", logger=wait_proxy_gone.__name__):
        assert wait_proxy_gone.main(["--port", str(proxy.port), "--timeout", "0"]) == 0
    assert "still drains" in caplog.text


@pytest.mark.parametrize("args", [["--port", "0", "--timeout", "1"], ["--port", "80", "--timeout", "-1"], []])
def test_bad_arguments_are_refused(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        wait_proxy_gone.main(args)
    assert exc.value.code == 2
