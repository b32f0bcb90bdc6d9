"""The failure contract (docs/proxy.md, "Failure contract"): one test per cell of its table, cause x phase,
each named ``test_<cause>_<phase>...`` and named in the table's last column; the last test keeps the two
in step. Engines are the recording fakes over real HTTP; a wait the test depends on is made short and the
others long, so which bound ended a request shows in its answer, never in a duration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from pd_runtime.proxy.config import Timeouts
from pd_runtime.proxy.contract import after_failure, phase
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.errors import (
    Cause,
    LegFailure,
    Phase,
    deadline_exceeded,
    engine_failed,
    kv_transfer_failed,
    no_instance,
    overloaded,
)
from tests.proxy.conftest import PdSetup, SetupFactory, second_instance
from tests.proxy.proxy_fakes import wait_for

BODY: dict[str, Any] = {"model": "m", "prompt": "Hello", "max_tokens": 8}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
TABLE = Path(__file__).parents[2] / "docs" / "proxy.md"


def _failures(setup: PdSetup, cause: Cause, at: Phase) -> float:
    value: float = setup.proxy.metrics.failures.labels(cause, at)._value.get()
    return value


def _error(body: Any, status: int, kind: str, code: str) -> None:
    """An OpenAI-style error body of ``kind`` (its type) and ``code``."""
    assert isinstance(body, dict) and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert (status, body["error"]["type"], body["error"]["code"]) == (status, kind, code), body


async def _raw_stream(setup: PdSetup, body: dict[str, Any]) -> tuple[bytes, list[str], int]:
    """One streamed request over a raw keep-alive connection, read by its chunked framing to the last
    chunk; then a second request on the same connection: the stream's head, its SSE events and the second
    answer's status (only a stream whose framing ended right leaves the connection able to carry it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.proxy.api_port)
    try:
        writer.write(_post({**body, "stream": True}))
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head, head
        data = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            data += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
        assert await reader.readexactly(2) == b"\r\n"  # the last chunk's empty trailer section
        writer.write(_post({**BODY, "max_tokens": 1}))
        second = await reader.readuntil(b"\r\n\r\n")
        events = [event.removeprefix("data: ") for event in data.decode().split("\n\n") if event]
        return head, events, int(second.split(b" ")[1])
    finally:
        writer.close()


def _post(body: dict[str, Any]) -> bytes:
    encoded = json.dumps(body).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(encoded), encoded)


def _stream_error(events: list[str], code: str) -> dict[str, Any]:
    """A stream that carried tokens, then one error event and ``[DONE]``: the error."""
    assert events[-1] == "[DONE]" and "choices" in json.loads(events[0]), events
    error: dict[str, Any] = json.loads(events[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, events[-3:]
    assert not any("error" in json.loads(e) for e in events[:-2])
    return error


# -- no instance ---------------------------------------------------------------------------------


async def test_no_instance_before_headers_is_503_with_retry_after(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(register=False)
    async with setup.client.post(setup.url + "/v1/completions", json=BODY) as resp:
        _error(await resp.json(), resp.status, "service_unavailable", "no_prefill_instance")
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    assert setup.prefill.requests == setup.decode.requests == []
    assert _failures(setup, "no_instance", "before_headers") == 1


# -- overloaded ----------------------------------------------------------------------------------


async def test_overloaded_before_headers_is_429_with_retry_after(pd_setup: SetupFactory) -> None:
    """Both waits before the engines: admission (--max-in-flight, no queue) and a decode slot
    (--decode-max-in-flight, its queue of one full batch): neither refused request reaches an engine."""
    setup = await pd_setup(mode="READ", max_in_flight=2, decode_max_in_flight=1)
    gate = setup.prefill.prefill_gate = asyncio.Event()  # the first request holds its decode slot in prefill
    first = asyncio.create_task(setup.post("/v1/completions", BODY))
    await wait_for(lambda: len(setup.prefill.requests) == 1, what="the first request in prefill")
    queued = asyncio.create_task(setup.post("/v1/completions", BODY))
    await wait_for(lambda: setup.proxy.core.decode_queue == 1, what="the second waiting for a decode slot")
    async with setup.client.post(setup.url + "/v1/completions", json=BODY) as resp:
        _error(await resp.json(), resp.status, "rate_limit_error", "rate_limit_exceeded")  # admission: 2 in flight
        assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
    setup.proxy.reconfigure(dataclasses.replace(setup.proxy.config, max_in_flight=0))
    async with setup.client.post(setup.url + "/v1/completions", json=BODY) as resp:
        _error(await resp.json(), resp.status, "rate_limit_error", "decode_at_capacity")  # the decode queue is full
        assert resp.status == 429 and resp.headers["Retry-After"] == "1"
    assert len(setup.prefill.requests) == 1 and setup.decode.requests == []
    assert _failures(setup, "overloaded", "before_headers") == 2
    gate.set()
    assert (await first)[0] == 200 and (await queued)[0] == 200


# -- engine failed -------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["prefill_5xx", "decode_5xx", "prefill_hung"])
async def test_engine_failed_before_headers_is_502_and_closes_the_other_leg(
    pd_setup: SetupFactory, failure: str
) -> None:
    """Write mode, both legs at once: a leg that reached the engine that did not fail is closed (vLLM aborts
    a request whose connection closes, and frees its blocks). A hung engine is a failed one: its leg's
    bound ends it (--first-byte-timeout, short: decode's first byte waits for prefill, which is blamed),
    not the request's deadline (long)."""
    setup = await pd_setup(mode="WRITE", timeouts=Timeouts(first_byte=0.3 if failure == "prefill_hung" else 600))
    if failure == "prefill_hung":
        setup.prefill.hang, setup.decode.first_chunk_delay = True, 600  # decode waits for KV that never comes
        leg, others = "prefill", [setup.prefill, setup.decode]
    else:
        failed, other = (setup.prefill, setup.decode) if failure == "prefill_5xx" else (setup.decode, setup.prefill)
        failed.status, other.hang = 500, True
        leg, others = ("prefill" if failed is setup.prefill else "decode"), [other]
    status, body = await setup.post("/v1/completions", {**BODY, "stream": True})
    _error(body, status, "upstream_error", f"{leg}_failed")
    assert status == 502 and "engine failure" not in body["error"]["message"]  # the engine's 5xx text stays
    await wait_for(lambda: all(r.cancelled for e in others for r in e.requests), what="the open legs closed")
    assert _failures(setup, "engine_failed", "before_headers") == 1


async def test_engine_failed_after_first_byte_is_an_error_event_then_done_on_a_live_connection(
    pd_setup: SetupFactory,
) -> None:
    """Decode dies after two tokens: no retry (the client has them), one error event, ``[DONE]``, the
    chunked body ended, and the same connection serves the next request."""
    setup = await pd_setup(mode="WRITE")
    setup.decode.chunks, setup.decode.die_after = 10, 2
    head, events, next_status = await _raw_stream(setup, BODY)
    assert head.startswith(b"HTTP/1.1 200") and len(events) == 4  # two tokens, the error, [DONE]
    error = _stream_error(events, "decode_failed")
    assert error["type"] == "upstream_error"
    assert next_status == 502  # the same dead decode: the connection carried a second, whole answer
    assert len(setup.decode.requests) == 2 and setup.proxy.metrics.failovers.labels("decode")._value.get() == 0
    assert _failures(setup, "engine_failed", "after_first_byte") == 1


# -- KV transfer failed --------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["kv_transfer_timeout", "kv_load_failed", "prefill_no_kv"])
async def test_kv_transfer_failed_before_headers_is_502_kv_transfer_error(pd_setup: SetupFactory, failure: str) -> None:
    """Both engines answered, the KV did not reach decode: no KV within the kv wait (both legs closed), a
    decode stream ended before its first token (vLLM 0.31's failed KV load), or a prefill that gave no KV
    under --no-kv-fallback error. None is retried: another engine pair would meet the same transfer path."""
    kv_wait = 0.3 if failure == "kv_transfer_timeout" else 600.0
    setup = await pd_setup(mode="WRITE", timeouts=Timeouts(first_byte=600, kv_wait=kv_wait), no_kv_fallback="error")
    body: dict[str, Any] = {**BODY, "stream": True}
    if failure == "kv_transfer_timeout":
        setup.decode.first_chunk_delay = 600
    elif failure == "kv_load_failed":
        setup.decode.fail_before_token = True
        body = {**CHAT, "stream": True}
    else:
        setup.prefill.null_params, setup.prefill.null_params_finish = True, "abort"
        setup.decode.first_chunk_delay = 600
    path = "/v1/chat/completions" if failure == "kv_load_failed" else "/v1/completions"
    status, answer = await setup.post(path, body)
    _error(answer, status, "kv_transfer_error", failure)
    assert status == 502
    await wait_for(lambda: all(r.cancelled or r.answered for r in setup.decode.requests), what="decode leg ended")
    assert _failures(setup, "kv_transfer_failed", "before_headers") == 1


# -- deadline ------------------------------------------------------------------------------------


async def test_deadline_before_headers_is_504_and_closes_both_legs(pd_setup: SetupFactory) -> None:
    """The request's one deadline is short, every leg's own bound long: prefill never answers, decode waits
    for its KV; at the deadline both legs are closed and the client gets 504."""
    setup = await pd_setup(mode="WRITE", timeouts=Timeouts(response=1.0))
    setup.prefill.hang, setup.decode.first_chunk_delay = True, 600
    status, body = await setup.post("/v1/completions", {**BODY, "stream": True})
    _error(body, status, "timeout_error", "deadline_exceeded")
    assert status == 504 and "--response-timeout" in body["error"]["message"]
    await wait_for(
        lambda: setup.prefill.requests[0].cancelled and setup.decode.requests[0].cancelled, what="both legs closed"
    )
    assert _failures(setup, "deadline", "before_headers") == 1


async def test_deadline_before_headers_covers_a_failover(pd_setup: SetupFactory) -> None:
    """A failover runs inside the same deadline, not a fresh one: the first prefill fails, the second
    hangs, and the deadline ends the request long before the second's own --prefill-timeout."""
    setup = await pd_setup(mode="READ", timeouts=Timeouts(response=1.0, prefill=600))
    setup.prefill.status = 500
    other = await second_instance(setup, "P", hang=True)
    status, body = await setup.post("/v1/completions", BODY)
    _error(body, status, "timeout_error", "deadline_exceeded")
    assert len(setup.prefill.requests) == len(other.requests) == 1 and setup.decode.requests == []
    assert setup.proxy.metrics.failovers.labels("prefill")._value.get() == 1
    await wait_for(lambda: other.requests[0].cancelled, what="the second prefill leg closed")


async def test_deadline_before_headers_covers_the_admission_queue(pd_setup: SetupFactory) -> None:
    """A request waiting for an admission slot meets its deadline before --queue-timeout: 504, and no
    engine saw it. The request already under way keeps the deadline it started with (a reload)."""
    setup = await pd_setup(mode="READ", max_in_flight=1, max_queued=1, queue_timeout_s=600)
    gate = setup.prefill.prefill_gate = asyncio.Event()
    first = asyncio.create_task(setup.post("/v1/completions", BODY))
    await wait_for(lambda: len(setup.prefill.requests) == 1, what="the first request in prefill")
    short = dataclasses.replace(setup.proxy.config, timeouts=Timeouts(response=1.0))
    setup.proxy.reconfigure(short)
    status, body = await setup.post("/v1/completions", BODY)
    _error(body, status, "timeout_error", "deadline_exceeded")
    assert "admission queue" in body["error"]["message"] and len(setup.prefill.requests) == 1
    gate.set()
    assert (await first)[0] == 200
    assert _failures(setup, "deadline", "before_headers") == 1


async def test_deadline_after_first_byte_is_an_error_event_then_done_on_a_live_connection(
    pd_setup: SetupFactory,
) -> None:
    """A stream still going at the deadline (chunks far inside --idle-timeout): one error event, ``[DONE]``,
    the decode leg closed, and the connection carries the next request."""
    setup = await pd_setup(mode="WRITE", timeouts=Timeouts(response=1.0))
    setup.decode.chunks, setup.decode.chunk_interval = 100_000, 0.01
    head, events, next_status = await _raw_stream(setup, BODY)
    assert head.startswith(b"HTTP/1.1 200")
    error = _stream_error(events, "deadline_exceeded")
    assert error["type"] == "timeout_error" and "while decode streamed" in error["message"]
    await wait_for(lambda: setup.decode.requests[0].cancelled, what="the decode leg closed")
    assert next_status == 504  # the same endless decode, answered whole: the deadline before its head
    assert _failures(setup, "deadline", "after_first_byte") == 1


# -- client gone ---------------------------------------------------------------------------------


async def test_client_gone_before_headers_closes_both_legs(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.prefill.hang, setup.decode.first_chunk_delay = True, 600
    request = asyncio.create_task(setup.post("/v1/completions", {**BODY, "stream": True}))
    await wait_for(lambda: bool(setup.prefill.requests and setup.decode.requests), what="both legs sent")
    request.cancel()
    await wait_for(
        lambda: setup.prefill.requests[0].cancelled and setup.decode.requests[0].cancelled, what="both legs closed"
    )
    await wait_for(lambda: _failures(setup, "client_gone", "before_headers") == 1, what="counted")


async def test_client_gone_after_first_byte_closes_both_legs(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="WRITE")
    setup.prefill.hang = True  # write mode: decode streams while prefill's answer is still due
    setup.decode.chunks, setup.decode.chunk_interval = 100_000, 0.01
    async with setup.client.post(setup.url + "/v1/completions", json={**BODY, "stream": True}) as resp:
        await resp.content.readuntil(b"\n\n")
        resp.close()
    await wait_for(
        lambda: setup.prefill.requests[0].cancelled and setup.decode.requests[0].cancelled, what="both legs closed"
    )
    await wait_for(lambda: _failures(setup, "client_gone", "after_first_byte") == 1, what="counted")


# -- the pure parts ------------------------------------------------------------------------------


def test_the_deadline_bounds_every_wait_and_tells_which_bound_ended_it() -> None:
    deadline = Deadline.after(100.0, 30.0)  # arrived at t=100
    assert deadline.bound(110.0) == 110.0 and not deadline.ended(deadline.bound(110.0))  # the phase's bound first
    assert deadline.bound(200.0) == 130.0 and deadline.ended(deadline.bound(200.0))  # the deadline first
    assert deadline.ended(deadline.bound(130.0))  # a tie is the deadline's: the client's budget is spent


def test_after_a_failure_only_a_failed_engine_before_the_first_byte_is_served_again() -> None:
    hung = LegFailure("decode", "timeout", engine_failed("decode", "hung"))
    lost_kv = LegFailure("decode", "kv_timeout", kv_transfer_failed("lost", "kv_transfer_timeout"))
    late = LegFailure("prefill", "deadline", deadline_exceeded("late"))
    assert after_failure(hung, started=False, canary=False, failed_over=False) == "fail_over"
    assert after_failure(hung, started=True, canary=False, failed_over=False) == "end_stream"
    assert after_failure(hung, started=False, canary=False, failed_over=True) == "answer_error"
    assert after_failure(hung, started=False, canary=True, failed_over=False) == "answer_error"
    for failure in (lost_kv, late):
        assert after_failure(failure, started=False, canary=False, failed_over=False) == "answer_error"
    assert (phase(False), phase(True)) == ("before_headers", "after_first_byte")


# -- the table in docs/proxy.md ------------------------------------------------------------------

STATUS: dict[str, int] = {
    "no_instance": no_instance("", "x").status,
    "overloaded": overloaded("", "x", 1).status,
    "engine_failed": engine_failed("decode", "").status,
    "kv_transfer_failed": kv_transfer_failed("", "x").status,
    "deadline": deadline_exceeded("").status,
}


def _table() -> list[list[str]]:
    text = TABLE.read_text()
    section = text[text.index("## Failure contract") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_the_failure_table_has_every_cell_and_a_test_for_each() -> None:
    """Every cause x phase is one row; each row that can happen names tests of this module that exist
    and, before the headers, the status its cause is answered with; one that cannot says why (n/a)."""
    rows = _table()
    cells = [(row[0].strip("`"), row[1].strip("`")) for row in rows]
    assert sorted(cells) == sorted((c, p) for c in get_args(Cause) for p in get_args(Phase)), cells
    defined = set(re.findall(r"^(?:async )?def (test_\w+)", Path(__file__).read_text(), re.MULTILINE))
    for (cause, at), row in zip(cells, rows, strict=True):
        names = re.findall(r"`(test_\w+)`", row[-1])
        if row[-1] == "n/a":
            assert row[2].startswith("cannot happen"), row
            continue
        assert names and all(name in defined for name in names), row
        assert all(name.startswith(f"test_{cause}_{at}") for name in names), row
        if at == "before_headers" and cause in STATUS:
            assert row[2].startswith(str(STATUS[cause])), row
