"""``timer.Timer`` keeps asyncio's ``Timeout`` contract: each test runs on both, so a difference shows as a
failure of the Timer's case alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from pd_runtime.proxy.timer import Timer

KINDS: list[Callable[[float | None], Any]] = [asyncio.timeout_at, Timer]
ids = ["asyncio", "timer"]


def _now() -> float:
    return asyncio.get_running_loop().time()


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_the_deadline_ends_the_wait_with_timeout_error(kind: Callable[[float | None], Any]) -> None:
    with pytest.raises(TimeoutError):
        async with kind(_now() + 0.01) as timer:
            await asyncio.sleep(10)
    assert timer.expired()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_wait_done_in_time_is_never_cancelled_afterwards(kind: Callable[[float | None], Any]) -> None:
    async with kind(_now() + 0.02) as timer:
        await asyncio.sleep(0)
    assert not timer.expired()
    await asyncio.sleep(0.05)  # past its time: its handle was cancelled on the way out


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_rescheduling_moves_the_deadline_both_ways(kind: Callable[[float | None], Any]) -> None:
    async with kind(_now() + 0.01) as timer:
        timer.reschedule(_now() + 600)
        await asyncio.sleep(0.05)  # the first time passed: nothing fired
        assert timer.when() > _now() + 500
    with pytest.raises(TimeoutError):
        async with kind(_now() + 600) as timer:
            timer.reschedule(_now() + 0.01)
            await asyncio.sleep(10)


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_time_already_past_fires_at_the_next_step(kind: Callable[[float | None], Any]) -> None:
    with pytest.raises(TimeoutError):
        async with kind(_now() - 1):
            await asyncio.sleep(10)


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_none_never_fires(kind: Callable[[float | None], Any]) -> None:
    async with kind(_now() + 0.01) as timer:
        timer.reschedule(None)
        await asyncio.sleep(0.05)
    assert timer.when() is None and not timer.expired()


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_cancellation_from_elsewhere_stays_a_cancellation(kind: Callable[[float | None], Any]) -> None:
    async def waits() -> None:
        async with kind(_now() + 600):
            await asyncio.sleep(10)

    task = asyncio.create_task(waits())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_cancellation_beside_the_deadline_wins(kind: Callable[[float | None], Any]) -> None:
    """The deadline fired and the task was cancelled from elsewhere too: the outer cancellation propagates."""
    entered = asyncio.Event()

    async def waits() -> None:
        async with kind(_now() + 600) as timer:
            entered.set()
            timer.reschedule(_now() - 1)  # fires at the next step, beside the cancel below
            await asyncio.sleep(10)

    task = asyncio.create_task(waits())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_finished_timer_cannot_be_rescheduled(kind: Callable[[float | None], Any]) -> None:
    async with kind(_now() + 600) as timer:
        pass
    with pytest.raises(RuntimeError):
        timer.reschedule(_now() + 1)
    with pytest.raises(RuntimeError):
        async with timer:
            pass


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_timer_not_yet_entered_cannot_be_rescheduled(kind: Callable[[float | None], Any]) -> None:
    with pytest.raises(RuntimeError):
        kind(_now() + 1).reschedule(_now() + 2)


@pytest.mark.parametrize("kind", KINDS, ids=ids)
async def test_a_deadline_moved_later_ends_the_wait_at_the_later_time(kind: Callable[[float | None], Any]) -> None:
    started = _now()
    with pytest.raises(TimeoutError):
        async with kind(started + 0.01) as timer:
            timer.reschedule(started + 0.03)
            timer.reschedule(started + 0.06)
            await asyncio.sleep(10)
    assert _now() >= started + 0.059  # not at the first time, nor the second


async def test_a_deadline_past_the_timers_check_is_kept_exactly() -> None:
    """The Timer's loop handle fires every few seconds (timer._CHECK_S) and arms again for what is left; the
    deadline itself neither moves nor fires at a check."""
    started = _now()
    with pytest.raises(TimeoutError):
        async with Timer(started + 5.3) as timer:
            timer.reschedule(started + 5.4)  # later: no new handle, the check carries it
            await asyncio.sleep(60)
    assert _now() >= started + 5.4 and timer.when() == started + 5.4
