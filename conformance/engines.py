"""Recording engines: real HTTP servers that judge each leg the proxy sends with vLLM's own code.

Each engine stands for one ``vllm serve`` built from our rendered command line: its MoRIIOConnector
(scheduler role) decides what the request means, its connector worker registers with the proxy. What
the engine does not have is a model: prompts are a fixed run of token ids, answers are a few tokens.

A leg is judged the way vLLM's API server and scheduler would take it:

* the body through vLLM's ``CompletionRequest`` model and ``to_sampling_params`` (where
  ``kv_transfer_params`` enter ``SamplingParams.extra_args``), then a ``vllm.v1.request.Request``;
* the request id as vLLM derives it from ``X-Request-Id`` (``OpenAIServing._base_request_id``, the
  ``cmpl-<id>-<i>`` wrapping of OpenAIServingCompletion restated in ``engine_request_id``, and
  ``InputProcessor.assign_request_id``'s random suffix), then the peer address in it parsed by
  ``moriio_common.get_peer_zmq_from_request_id`` / ``parse_moriio_zmq_address``;
* prefill: ``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``MoRIIOConnectorMetadata.
  add_new_req`` (the ingest ``build_connector_meta`` runs) and ``request_finished``, whose answer is the
  ``kv_transfer_params`` this engine returns, as vLLM's does;
* decode: ``get_num_new_matched_tokens`` says whether the engine waits for (write) or loads (read)
  remote KV; ``update_state_after_alloc`` sends the real write-mode notify to the prefill's notify port;
  in read mode ``build_connector_meta`` must hold the blocks the prefill returned.

A decode that would wait for KV no prefill sends holds its connection (as vLLM 0.29 does) and is a
violation unless the proxy closes it within ``ABANDON_GRACE_S``.

ONE_ENGINE_PER_PROCESS: vLLM keeps the connector's role in a process-wide singleton (``RoleManager``);
here a prefill and a decode share one process, so each sets its role before calling its connector.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

import msgpack
import zmq
import zmq.asyncio
from aiohttp import web
from multidict import CIMultiDict
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.moriio import moriio_common
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.request import Request, RequestStatus

from conformance.vllm_code import scheduler_connector

EngineRole = Literal["prefill", "decode", "engine"]
PROMPT_TOKENS = 40  # three 16-token blocks: enough for the connector to move KV
BLOCK_SIZE = 16
ABANDON_GRACE_S = 2.0  # how long a decode may hold a request whose KV never comes before it is a violation
KV_WAIT_S = 8.0  # how long a decode waits for its prefill's outcome
NOTIFY_WAIT_S = 1.0  # how long a write-mode notify may take to reach the prefill over loopback ZMQ


def engine_request_id(headers: CIMultiDict[str], body_request_id: str | None) -> str:
    """The request id a completion gets inside vLLM's engine.

    REQUEST_ID_WRAPPING: ``cmpl-<X-Request-Id>-<prompt index>`` is how OpenAIServingCompletion wraps the
    header (restated here: it runs inside the serving coroutine, with a live engine); the header lookup
    and the random suffix are vLLM's own functions.
    """
    base = OpenAIServingCompletion._base_request_id(SimpleNamespace(headers=headers), body_request_id)
    engine_request = SimpleNamespace(request_id=f"cmpl-{base}-0", external_req_id=None)
    InputProcessor.assign_request_id(engine_request)  # type: ignore[arg-type]
    request_id: str = engine_request.request_id
    return request_id


@dataclass
class ProducerOutcome:
    """What a prefill's connector decided in request_finished: will it send KV for this transfer?"""

    sends: bool
    block_ids: Any  # the remote_block_ids it returned (one list, or one per KV-cache group from 0.33)


@dataclass
class Ledger:
    """Shared by the engines of one test: the prefill outcome of each transfer id."""

    outcomes: dict[str, ProducerOutcome] = field(default_factory=dict)
    told: set[str] = field(default_factory=set)  # write mode: transfer ids a prefill got decode's blocks for
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, transfer_id: str, outcome: ProducerOutcome) -> None:
        self.outcomes[transfer_id] = outcome
        self.changed.set()

    def tell(self, transfer_id: str) -> None:
        self.told.add(transfer_id)
        self.changed.set()

    async def until(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    async def wait_for(self, transfer_id: str, timeout: float) -> ProducerOutcome | None:
        await self.until(lambda: transfer_id in self.outcomes, timeout)
        return self.outcomes.get(transfer_id)


@dataclass
class LegRecord:
    """One upstream request as the engine saw it, and what vLLM's code made of it."""

    engine: EngineRole
    headers: CIMultiDict[str]
    body: dict[str, Any]
    request_id: str = ""
    kv_transfer_params: dict[str, Any] | None = None
    matched: tuple[int, bool] | None = None  # get_num_new_matched_tokens
    peer: tuple[str, int, int] | None = None  # from the request id
    answered: bool = False
    closed_by_proxy: bool = False
    violations: list[str] = field(default_factory=list)

    @property
    def transfer_id(self) -> str | None:
        params = self.kv_transfer_params or {}
        tid = params.get("transfer_id")
        return tid if isinstance(tid, str) else None


@dataclass
class Behaviour:
    """How a test wants the engine to answer."""

    prefill_delay_s: float = 0.0
    # the prompt's first token is EOS: a prefill stops there (FINISHED_STOPPED, no KV to send) unless its
    # min_tokens masks the stop token, as vLLM's MinTokensLogitsProcessor does (then FINISHED_LENGTH_CAPPED)
    first_token_ends: bool = False
    chunks: int = 3
    chunk_gap_s: float = 0.0


class RecordingEngine:
    """One engine: HTTP on ``http_port`` and, with a connector, a notify listener on ``notify_port``."""

    def __init__(
        self,
        role: EngineRole,
        config: VllmConfig | None,
        http_port: int,
        ledger: Ledger,
        behaviour: Behaviour,
        peer_zmq: dict[EngineRole, str],
    ) -> None:
        self.role = role
        self.http_port = http_port
        self.ledger = ledger
        self.behaviour = behaviour
        self.peer_zmq = peer_zmq  # zmq_address each engine registered, by role (from vLLM's worker)
        self.connector = scheduler_connector(config) if config is not None else None
        self.legs: list[LegRecord] = []
        self.notifies: list[dict[str, Any]] = []
        self._next_block = 1
        self._runner: web.AppRunner | None = None
        self._zmq: zmq.asyncio.Context | None = None
        self._notify_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self, notify_port: int | None) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.http_port).start()
        if notify_port is not None:
            self._zmq = zmq.asyncio.Context()
            sock = self._zmq.socket(zmq.ROUTER)
            sock.bind(f"tcp://127.0.0.1:{notify_port}")
            self._notify_task = asyncio.create_task(self._read_notifies(sock))

    async def stop(self) -> None:
        if self._notify_task is not None:
            self._notify_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._notify_task
        if self._zmq is not None:
            self._zmq.destroy(linger=0)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.connector is not None:
            self.connector.shutdown()

    async def _read_notifies(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            _identity, frame = await sock.recv_multipart()
            message = msgpack.unpackb(frame, raw=False)
            self.notifies.append(message)
            if isinstance(message, dict) and message.get("type") == "remote_blocks":
                self.ledger.tell(str(message.get("transfer_id")))

    # -- HTTP --------------------------------------------------------------------------------------

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "conformance-model", "object": "model"}]})

    async def _completions(self, http: web.Request) -> web.StreamResponse:
        leg = LegRecord(self.role, CIMultiDict(http.headers), json.loads(await http.read()))
        self.legs.append(leg)
        try:
            request = self._engine_request(http, leg)
            if request is None:
                return web.json_response({"error": {"message": "; ".join(leg.violations)}}, status=400)
            if self.role == "prefill":
                return await self._prefill(leg, request)
            if self.role == "decode":
                await self._decode_gets_its_kv(http, leg, request)
            return await self._answer(http, leg, request)
        except (asyncio.CancelledError, ConnectionResetError):
            leg.closed_by_proxy = True
            raise

    def _engine_request(self, http: web.Request, leg: LegRecord) -> Request | None:
        """The body and id as vLLM's API server turns them into an engine request."""
        try:
            body = CompletionRequest.model_validate(leg.body)
        except ValueError as err:
            leg.violations.append(f"vLLM's CompletionRequest rejects the body: {err}")
            return None
        leg.request_id = engine_request_id(leg.headers, body.request_id)
        params = body.to_sampling_params(max_tokens=body.max_tokens or 16)
        request = Request(leg.request_id, list(range(1, PROMPT_TOKENS + 1)), params, None)
        leg.kv_transfer_params = request.kv_transfer_params
        if self.role != "engine":
            self._check_peer(leg)
        return request

    def _check_peer(self, leg: LegRecord) -> None:
        """The peer address vLLM's helper finds in the request id is the one the peer registered."""
        producer = self.role == "prefill"
        peer_role: EngineRole = "decode" if producer else "prefill"
        try:
            zmq_address = moriio_common.get_peer_zmq_from_request_id(leg.request_id, is_producer=producer)
            if zmq_address is None:
                raise ValueError("no peer address in it")
            leg.peer = moriio_common.parse_moriio_zmq_address(zmq_address)
        except ValueError as err:
            leg.violations.append(f"request id {leg.request_id!r} does not parse with vLLM's helpers: {err}")
            return
        expected = moriio_common.parse_moriio_zmq_address(self.peer_zmq[peer_role])
        if leg.peer != expected:
            leg.violations.append(f"request id names peer {leg.peer}, but the {peer_role} registered {expected}")

    def _blocks(self) -> KVCacheBlocks:
        count = -(-PROMPT_TOKENS // BLOCK_SIZE)
        ids = range(self._next_block, self._next_block + count)
        self._next_block += count
        return KVCacheBlocks(blocks=([KVCacheBlock(block_id=i) for i in ids],))

    # -- prefill -----------------------------------------------------------------------------------

    async def _prefill(self, leg: LegRecord, request: Request) -> web.Response:
        assert self.connector is not None
        params = leg.kv_transfer_params or {}
        if not params.get("do_remote_decode") or not leg.transfer_id:
            leg.violations.append(f"prefill leg without do_remote_decode and a transfer_id: {params}")
        leg.matched = self.connector.get_num_new_matched_tokens(request, 0)
        blocks = self._blocks()
        moriio_common.set_role(moriio_common.ROLE.PRODUCER)  # ONE_ENGINE_PER_PROCESS
        self.connector.update_state_after_alloc(request, blocks, 0)
        block_ids = blocks.get_block_ids()[0]
        try:  # the ingest build_connector_meta runs for this request on its last chunk
            moriio_common.MoRIIOConnectorMetadata().add_new_req(leg.request_id, block_ids, dict(params), True)
        except (KeyError, ValueError) as err:
            leg.violations.append(f"prefill connector cannot ingest the leg: {err!r}")
        await asyncio.sleep(self.behaviour.prefill_delay_s)
        assert request.sampling_params is not None
        stops = self.behaviour.first_token_ends and request.sampling_params.min_tokens == 0
        request.status = RequestStatus.FINISHED_STOPPED if stops else RequestStatus.FINISHED_LENGTH_CAPPED
        delay_free, returned = self.connector.request_finished(request, block_ids)
        if leg.transfer_id:
            sent_blocks = returned.get("remote_block_ids") if returned else None
            self.ledger.record(leg.transfer_id, ProducerOutcome(delay_free and returned is not None, sent_blocks))
        finish = "stop" if stops else "length"
        response = CompletionResponse(
            id=leg.request_id,
            model=leg.body.get("model", ""),
            choices=[CompletionResponseChoice(index=0, text=" first", finish_reason=finish)],
            usage={"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1, "total_tokens": PROMPT_TOKENS + 1},
            kv_transfer_params=returned,
        )
        leg.answered = True
        return web.Response(text=response.model_dump_json(), content_type="application/json")

    # -- decode ------------------------------------------------------------------------------------

    async def _decode_gets_its_kv(self, http: web.Request, leg: LegRecord, request: Request) -> None:
        """Judge the leg with the consumer's connector; hold it like vLLM when its KV never comes."""
        assert self.connector is not None
        params = leg.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            leg.violations.append(f"decode leg without remote-prefill kv_transfer_params: {params}")
        leg.matched = self.connector.get_num_new_matched_tokens(request, 0)
        external, _load_async = leg.matched
        blocks = self._blocks()
        moriio_common.set_role(moriio_common.ROLE.CONSUMER)  # ONE_ENGINE_PER_PROCESS
        try:
            self.connector.update_state_after_alloc(request, blocks, external)
        except (KeyError, ValueError) as err:
            leg.violations.append(f"decode connector rejects the leg: {err!r}")
        if external <= 0:
            return
        outcome = await self.ledger.wait_for(leg.transfer_id, KV_WAIT_S) if leg.transfer_id else None
        problem = self._kv_problem(leg, outcome)
        if problem is None and self.connector.mode == moriio_common.MoRIIOMode.WRITE:
            tid = leg.transfer_id
            if not await self.ledger.until(lambda: tid in self.ledger.told, NOTIFY_WAIT_S):
                problem = "waits for KV, but its prefill was never told where to write it (no remote_blocks notify)"
        if problem is None:
            return
        # vLLM waits (write) or decodes from nothing (read); either way the proxy must not keep the leg.
        if await _closed_within(http, ABANDON_GRACE_S):
            leg.closed_by_proxy = True  # aiohttp may not cancel a handler whose client left before it ran
            return
        leg.violations.append(
            f"decode request {leg.request_id!r} {problem}, and the proxy still held it {ABANDON_GRACE_S:g} s later "
            f"(connector: get_num_new_matched_tokens -> {leg.matched})"
        )

    def _kv_problem(self, leg: LegRecord, outcome: ProducerOutcome | None) -> str | None:
        """Why the KV this decode expects will never be there, or None when a prefill provides it."""
        assert self.connector is not None
        if outcome is None:
            return (
                "waits for KV, but no prefill took its transfer id"
                if leg.transfer_id
                else "waits for KV of no transfer"
            )
        if not outcome.sends:
            return "waits for KV that its prefill will not send (the prefill request ended without a KV transfer)"
        if self.connector.mode == moriio_common.MoRIIOMode.READ:
            step = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[]))
            try:
                meta = self.connector.build_connector_meta(step)  # type: ignore[arg-type]
            except (KeyError, ValueError) as err:
                return f"cannot schedule the read of its KV: {err!r}"
            loads = meta.reqs_to_recv.get(leg.request_id)
            if loads is None:
                return "would decode from KV it never loads (no read scheduled)"
            if loads.remote_block_ids != outcome.block_ids or loads.transfer_id != leg.transfer_id:
                return f"would read blocks {loads.remote_block_ids} of {loads.transfer_id}, not the prefill's"
        return None

    # -- answers -----------------------------------------------------------------------------------

    async def _answer(self, http: web.Request, leg: LegRecord, request: Request) -> web.StreamResponse:
        model = leg.body.get("model", "")
        finish = self.behaviour.chunks
        if not leg.body.get("stream"):
            response = CompletionResponse(
                id=leg.request_id,
                model=model,
                choices=[CompletionResponseChoice(index=0, text=" tok" * finish, finish_reason="length")],
                usage={"prompt_tokens": PROMPT_TOKENS, "completion_tokens": finish, "total_tokens": PROMPT_TOKENS},
            )
            self._finished(leg, request)
            return web.Response(text=response.model_dump_json(), content_type="application/json")
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(http)
        async for chunk in self._chunks(leg, model):
            await stream.write(chunk)
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        self._finished(leg, request)
        return stream

    async def _chunks(self, leg: LegRecord, model: str) -> AsyncIterator[bytes]:
        for i in range(self.behaviour.chunks):
            last = i == self.behaviour.chunks - 1
            choice = CompletionResponseStreamChoice(index=0, text=" tok", finish_reason="length" if last else None)
            chunk = CompletionStreamResponse(id=leg.request_id, model=model, choices=[choice])
            yield f"data: {chunk.model_dump_json()}\n\n".encode()
            await asyncio.sleep(self.behaviour.chunk_gap_s)

    def _finished(self, leg: LegRecord, request: Request) -> None:
        leg.answered = True
        if self.connector is not None:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            self.connector.request_finished(request, [])


async def _closed_within(http: web.Request, seconds: float) -> bool:
    """Whether the client closes the request's connection within ``seconds`` (polled)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if http.transport is None or http.transport.is_closing():
            return True
        await asyncio.sleep(0.02)
    return False
