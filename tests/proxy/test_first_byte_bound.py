"""The kv wait brings a streaming decode leg's first-byte deadline forward only while that leg runs."""

from __future__ import annotations

import asyncio

import pytest

from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.legs import ClientRequest, TransferIds
from pd_runtime.proxy.relay import Exchange
from pd_runtime.proxy.timer import Timer


def _exchange() -> Exchange:
    request = ClientRequest("completions", {"model": "m", "prompt": "p", "stream": True})
    ids = TransferIds(uid="u", transfer_id="t", request_id="r")
    return Exchange(request, ids, "request", deadline=Deadline.after(0.0, 1e9), loop=asyncio.get_running_loop())


async def test_prefill_answering_moves_a_running_legs_deadline_forward() -> None:
    exchange, loop = _exchange(), asyncio.get_running_loop()
    async with (
        Timer(asyncio.get_running_loop().time() + 600) as timer,
        exchange.first_byte_bounded(timer, bounded=True),
    ):
        exchange.prefill_answered(5.0)
        assert (timer.when() or 0) <= loop.time() + 5.0
    assert exchange.first_byte_timer is None


async def test_prefill_answering_after_the_leg_ended_touches_no_finished_timeout() -> None:
    exchange = _exchange()
    with pytest.raises(RuntimeError, match="leg failed fast"):
        async with (
            Timer(asyncio.get_running_loop().time() + 600) as timer,
            exchange.first_byte_bounded(timer, bounded=True),
        ):
            raise RuntimeError("leg failed fast")
    exchange.prefill_answered(5.0)  # rescheduling the finished timer raised RuntimeError here before
    assert exchange.kv_deadline is not None


async def test_an_unbounded_leg_is_never_moved() -> None:
    exchange = _exchange()
    async with (
        Timer(asyncio.get_running_loop().time() + 600) as timer,
        exchange.first_byte_bounded(timer, bounded=False),
    ):
        exchange.prefill_answered(5.0)
        assert exchange.first_byte_timer is None and (timer.when() or 0) > asyncio.get_running_loop().time() + 500
