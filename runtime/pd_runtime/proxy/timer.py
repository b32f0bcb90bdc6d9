"""A leg's deadline: ``async with Timer(when)`` cancels the task inside once the loop's clock reaches
``when`` and turns that cancellation into TimeoutError, as ``asyncio.timeout_at`` does.

The same contract as asyncio's ``Timeout`` (``when``, ``reschedule``, a cancellation from elsewhere left as
it is), written here so that mypyc compiles it: asyncio's is Python, entered and left on every leg and
rescheduled on every relayed chunk (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio

_CREATED, _ENTERED, _EXPIRING, _EXPIRED, _EXITED = range(5)
_CHECK_S = 5.0
"""A Timer's loop handle fires at its time or this much from when it was armed, whichever is first, and arms
again for what is left: a deadline moved later then costs no new loop timer (uvloop's cost thousands of
instructions each), and a leg's deadlines mostly move later (300 s to the first byte, then the 95 s kv wait
from prefill's answer, then 60 s between chunks, all beyond the first check of a request of seconds)."""


class RunningLoop:
    """The loop the proxy serves on, looked up at its first use and kept: ``asyncio.get_running_loop()``,
    and ``asyncio.current_task()`` without a loop, make a getpid system call each in CPython 3.11 (its
    check for a fork), nine per request before (docs/benchmarks.md). The proxy runs on one loop."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def time(self) -> float:
        return self.get().time()


class Timer:
    __slots__ = ("_armed", "_cancelling", "_handle", "_loop", "_state", "_task", "_when")

    def __init__(self, when: float | None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: the running loop, when the caller has it (looking it up is a system call)."""
        self._when = when
        self._state = _CREATED
        self._handle: asyncio.Handle | None = None
        self._armed = 0.0  # the loop time the handle fires at
        self._task: asyncio.Task[object] | None = None
        self._loop = loop
        self._cancelling = 0

    def when(self) -> float | None:
        """Loop time it ends the task at (None: never)."""
        return self._when

    def expired(self) -> bool:
        """Whether it ended the task (it did so once its ``async with`` raised TimeoutError)."""
        return self._state == _EXPIRING or self._state == _EXPIRED

    def reschedule(self, when: float | None) -> None:
        """End the task at ``when`` instead (None: never); only inside its ``async with`` and before it
        fired (RuntimeError otherwise, as asyncio's)."""
        if self._state != _ENTERED or self._loop is None:
            raise RuntimeError("Timer is not in its async with, or has expired")
        self._when = when
        if when is not None and self._handle is not None and when >= self._armed:
            return  # the armed handle fires first and arms again for the rest (_CHECK_S)
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        if when is not None:
            self._arm(when)

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._armed = min(when, now + _CHECK_S)
        if when <= now:
            self._handle = self._loop.call_soon(self._fire)
        else:
            self._handle = self._loop.call_at(self._armed, self._fire)

    async def __aenter__(self) -> Timer:
        if self._state != _CREATED:
            raise RuntimeError("Timer has already been entered")
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("Timer should be used inside a task")
        self._task = task
        self._loop = task.get_loop()
        self._cancelling = task.cancelling()
        self._state = _ENTERED
        self.reschedule(self._when)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state == _EXPIRING:
            self._state = _EXPIRED
            assert self._task is not None
            # Our own cancellation, and no other one pending: the deadline's TimeoutError
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                raise TimeoutError from exc
        elif self._state == _ENTERED:
            self._state = _EXITED

    def _fire(self) -> None:
        assert self._task is not None and self._loop is not None
        if self._when is not None and self._when > self._armed:  # a check, or moved later since it was armed
            self._arm(self._when)
            return
        self._task.cancel()
        self._state = _EXPIRING
        self._handle = None
