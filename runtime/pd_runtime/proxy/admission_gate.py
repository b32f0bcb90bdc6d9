"""The asyncio shell of admission (``admission.Admission`` decides): the API handlers hold a slot with
``async with gate.admitted(deadline)``; queued requests wait on a future each (docs/proxy.md, "Admission")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from pd_runtime.proxy.admission import Admission, too_many_requests
from pd_runtime.proxy.deadline import Deadline
from pd_runtime.proxy.errors import ApiError, deadline_exceeded
from pd_runtime.proxy.metrics import ProxyMetrics

RejectReason = Literal["queue_full", "queue_timeout"]


class AdmissionGate:
    """The asyncio shell over ``Admission``: ``async with gate.admitted(deadline): serve``.

    A waiter's future is resolved when a released slot is handed to it; a client that leaves while queued
    (its handler is cancelled) leaves the queue, and a slot handed to it just then goes on to the next
    ticket. The metrics show the queue's depth, the refusals by reason and the waits of admitted requests.
    """

    def __init__(
        self, limit: int, max_queued: int, timeout_s: float, metrics: ProxyMetrics, clock: Callable[[], float]
    ) -> None:
        self.state = Admission(limit, max_queued)
        self.timeout_s = timeout_s
        self._metrics = metrics
        self._clock = clock
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._tickets = 0
        metrics.admission_queue.set_function(self._queued)

    def _queued(self) -> float:
        """pd_proxy_admission_queue, read when scraped (a locked set was per request)."""
        return self.state.queued

    def reconfigure(self, limit: int, max_queued: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._wake(self.state.reconfigure(limit, max_queued))

    def drain(self, error: ApiError) -> None:
        for ticket in self.state.drain():
            waiter = self._waiters.get(ticket)
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)

    def _wake(self, tickets: list[int]) -> None:
        for ticket in tickets:
            waiter = self._waiters.get(ticket)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            else:  # its client left after its waiter was cancelled, before it ran: pass the slot on
                self._release(None)

    def _release(self, held_s: float | None) -> None:
        self._wake(self.state.release(held_s))

    def _refuse(self, reason: RejectReason) -> ApiError:
        self._metrics.admission_rejections.labels(reason).inc()
        state = self.state
        why = (
            f"the queue of {state.max_queued} is full"
            if reason == "queue_full"
            else f"it waited {self.timeout_s:g} s in the queue"
        )
        return too_many_requests(
            f"the proxy is at its limit of {state.limit} requests in flight and {why}; retry later",
            state.retry_after(),
        )

    async def _wait(self, ticket: int, deadline: Deadline) -> None:
        """Until a slot is handed to ``ticket`` (it then holds it) or a refusal is raised: 429 after
        --queue-timeout, 504 when the request's deadline comes first."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = waiter

        def holds_slot() -> bool:  # out of the queue because a slot was handed to it
            left = self.state.leave(ticket)
            return not left and waiter.done() and not waiter.cancelled() and waiter.exception() is None

        until = deadline.bound(asyncio.get_running_loop().time() + self.timeout_s)
        try:
            async with asyncio.timeout_at(until):
                await waiter
        except TimeoutError:
            if not holds_slot():
                if deadline.ended(until):
                    raise deadline_exceeded(deadline.describe("in the admission queue")) from None
                raise self._refuse("queue_timeout") from None
            # admitted at the very deadline: serve it
        except BaseException:
            if holds_slot():
                self._release(None)  # the slot reached it just as its client left: pass it on
            raise
        finally:
            del self._waiters[ticket]

    def admitted(self, deadline: Deadline) -> Admitted:
        """Hold a slot for the body of ``async with``; raises the 429 ApiError when refused, the 504 one when
        the request's deadline passed while it waited."""
        return Admitted(self, deadline)

    async def _enter(self, deadline: Deadline) -> float:
        """Take a slot (waiting in the queue if need be): the clock when it was taken."""
        self._tickets += 1
        ticket = self._tickets
        decision = self.state.arrive(ticket)
        if decision == "full":
            raise self._refuse("queue_full")
        if decision == "queued":
            arrived = self._clock()
            await self._wait(ticket, deadline)
            self._metrics.admission_wait.observe(self._clock() - arrived)
        return self._clock()

    def _exit(self, started: float) -> None:
        self._release(self._clock() - started)


class Admitted:
    """``async with gate.admitted()``: a class rather than an async generator, which costs an object and a
    generator step more per request and which mypyc does not compile (docs/benchmarks.md)."""

    __slots__ = ("_deadline", "_gate", "_started")

    def __init__(self, gate: AdmissionGate, deadline: Deadline) -> None:
        self._gate = gate
        self._deadline = deadline
        self._started = 0.0

    async def __aenter__(self) -> None:
        self._started = await self._gate._enter(self._deadline)

    async def __aexit__(self, *exc: object) -> None:
        self._gate._exit(self._started)
