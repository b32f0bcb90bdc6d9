"""Pure: a client request -> the exact prefill and decode legs of docs/protocol.md#request-flow.

No I/O here. ``parse_client_request`` validates what the proxy relies on (anything else is left to the
engine, whose 4xx is passed through) and strips what clients must not control; the ``*_leg`` builders
return the path, headers and body of each upstream request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pd_runtime.protocol import (
    Registration,
    decode_leg_params,
    make_request_id,
    new_request_uid,
    new_transfer_id,
    prefill_leg_params,
)
from pd_runtime.proxy import jsoncodec
from pd_runtime.proxy.errors import bad_request

Endpoint = Literal["completions", "chat/completions"]
ProxyMode = Literal["disaggregated", "colocated"]
MaxTokensPolicy = Literal["exact", "decrement"]

TOKEN_LIMIT_KEYS = ("max_tokens", "max_completion_tokens")
# Fields a client may send that would let it forge the transfer (docs/protocol.md#http-legs).
CLIENT_FORBIDDEN_KEYS = ("kv_transfer_params", "request_id")


class ClientRequest:
    """A validated client request with client-controlled transfer fields already removed.

    This and the other classes built per request (``Target``, ``TransferIds``, ``Leg``) are plain classes
    with slots, not dataclasses: mypyc compiles a plain class's ``__init__``, a dataclass's generated one
    (a frozen one's ``object.__setattr__`` per field) stays interpreted (docs/benchmarks.md). Never changed
    once built."""

    __slots__ = ("body", "endpoint", "trace")

    def __init__(self, endpoint: Endpoint, body: dict[str, Any], trace: dict[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self.body = body
        self.trace: dict[str, str] = {} if trace is None else trace
        """The client's valid W3C trace context headers, forwarded on every leg (``trace_headers``)."""

    def __repr__(self) -> str:
        return f"ClientRequest(endpoint={self.endpoint!r}, body={self.body!r}, trace={self.trace!r})"

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))

    @property
    def path(self) -> str:
        return f"/v1/{self.endpoint}"


class Target:
    """One routing decision: an instance and, for DP>1 instances, the DP rank to pin."""

    __slots__ = ("dp_rank", "instance")

    def __init__(self, instance: Registration, dp_rank: int | None = None) -> None:
        self.instance = instance
        self.dp_rank = dp_rank

    def __repr__(self) -> str:
        return f"Target(instance={self.instance!r}, dp_rank={self.dp_rank!r})"


class TransferIds:
    """The ids of one disaggregated request (docs/protocol.md#request-ids)."""

    __slots__ = ("request_id", "transfer_id", "uid")

    def __init__(self, uid: str, transfer_id: str, request_id: str) -> None:
        self.uid = uid  # 32 lowercase hex: the tail of X-Request-Id and the id clients see
        self.transfer_id = transfer_id  # tx-<uuid4>
        self.request_id = request_id  # X-Request-Id, the same on both legs

    @classmethod
    def mint(cls, prefill: Registration, decode: Registration) -> TransferIds:
        uid = new_request_uid()
        return cls(uid, new_transfer_id(), make_request_id(prefill, decode, uid))

    def __repr__(self) -> str:
        return f"TransferIds(uid={self.uid!r}, transfer_id={self.transfer_id!r}, request_id={self.request_id!r})"


class Leg:
    """One upstream HTTP request."""

    __slots__ = ("assembled", "body", "headers", "path")

    def __init__(self, path: str, headers: dict[str, str], body: dict[str, Any], assembled: bool = False) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        self.assembled = assembled
        """Streamed for a client that did not ask for a stream: its answer is assembled (``streams_whole``)."""

    def encoded(self) -> bytes:
        return jsoncodec.dumps(self.body)


# ---------------------------------------------------------------------------------------------
# Client request validation
# ---------------------------------------------------------------------------------------------


def parse_client_request(
    raw: bytes | bytearray,
    endpoint: Endpoint,
    mode: ProxyMode,
    max_tokens_limit: int,
    headers: Mapping[str, str] | None = None,
) -> ClientRequest:
    """Decode and check a client body; raises ApiError (400) for anything the proxy cannot route.

    ``headers`` (names lowercased) are the client's; only its trace context is kept (``trace_headers``).
    """
    body = _json_object(raw)
    _check_bool(body, "stream")
    for key in TOKEN_LIMIT_KEYS:
        _check_token_limit(body, key, max_tokens_limit)
    for key in ("min_tokens", "n", "best_of"):
        _check_int(body, key, minimum=0 if key == "min_tokens" else 1)
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    if endpoint == "completions":
        _check_prompt(body.get("prompt"), disaggregated=mode == "disaggregated")
    else:
        _check_messages(body.get("messages"))
    if mode == "disaggregated":
        _check_single_sequence(body)
    for key in CLIENT_FORBIDDEN_KEYS:
        body.pop(key, None)
    return ClientRequest(endpoint=endpoint, body=body, trace=trace_headers(headers or {}))


# W3C Trace Context (https://www.w3.org/TR/trace-context/#traceparent-header-field-values): lowercase hex
# only; version ff is invalid; version 00 is exactly these four fields, a later version may append
# "-"-led fields. All-zero trace and parent ids are invalid.
_TRACEPARENT = re.compile(r"(?!ff)([0-9a-f]{2})-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-.*)?")
_TRACESTATE_MAX = 512  # what the spec asks a vendor to propagate at least; longer ones are dropped
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's trace context for the legs: ``traceparent`` when valid, with ``tracestate`` (only beside
    a valid traceparent, as the spec says). Anything invalid is dropped, never forwarded nor invented.
    Repeated traceparent headers arrive joined with ", " and so fail the pattern, as the spec wants."""
    parent = headers.get("traceparent", "")
    match = _TRACEPARENT.fullmatch(parent)
    if match is None or (match.group(1) == "00" and match.group(2) is not None):
        return {}
    trace = {"traceparent": parent}
    state = headers.get("tracestate", "").strip()
    if state and len(state) <= _TRACESTATE_MAX and _PRINTABLE.fullmatch(state):
        trace["tracestate"] = state
    return trace


def _json_object(raw: bytes | bytearray) -> dict[str, Any]:
    try:
        body = jsoncodec.loads(raw)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise bad_request("request body is nested too deeply", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_bool(body: dict[str, Any], key: str) -> None:
    if body.get(key) is not None and not isinstance(body[key], bool):
        raise bad_request(f"'{key}' must be a boolean", param=key)


def _check_int(body: dict[str, Any], key: str, minimum: int) -> None:
    value = body.get(key)
    if value is not None and (not _is_int(value) or value < minimum):
        raise bad_request(f"'{key}' must be an integer >= {minimum}", param=key)


def _check_token_limit(body: dict[str, Any], key: str, limit: int) -> None:
    value = body.get(key)
    if value is None:
        return
    if not _is_int(value) or value < 1:
        raise bad_request(f"'{key}' must be an integer >= 1", param=key)
    if value > limit:
        raise bad_request(f"'{key}' is {value}, more than this proxy allows ({limit})", param=key)


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(token) for token in value)


def _check_prompt(prompt: Any, disaggregated: bool) -> None:
    """A prompt is a string or one list of token ids; a list of those is a batch (one prompt each)."""
    if isinstance(prompt, str) and prompt:
        return
    if _is_token_list(prompt):
        return
    is_batch = (
        isinstance(prompt, list)
        and bool(prompt)
        and all((isinstance(p, str) and p) or _is_token_list(p) for p in prompt)
    )
    if not is_batch:
        raise bad_request(
            "'prompt' must be a non-empty string, a list of token ids, or a list of those", param="prompt"
        )
    if disaggregated and len(prompt) > 1:
        raise bad_request(
            "batched prompts are not supported in disaggregated mode: send one prompt per request",
            param="prompt",
            code="batch_not_supported",
        )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise bad_request("'messages' must be a non-empty list of objects", param="messages")


def _check_single_sequence(body: dict[str, Any]) -> None:
    """docs/protocol.md#toy-proxy: several sequences would share one transfer id and one set of KV blocks."""
    for key in ("n", "best_of"):
        if (body.get(key) or 1) > 1:
            raise bad_request(
                f"'{key}' > 1 is not supported in disaggregated mode: send one request per sequence",
                param=key,
                code="n_not_supported",
            )


# ---------------------------------------------------------------------------------------------
# Legs
# ---------------------------------------------------------------------------------------------


def _headers(
    request: ClientRequest, request_id: str, dp_rank: int | None, engine_api_key: str | None
) -> dict[str, str]:
    """docs/protocol.md#http-legs: the only headers sent upstream; of the client's, only its valid trace
    context (docs/proxy.md, "Trace context")."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id, **request.trace}
    if engine_api_key:
        headers["Authorization"] = f"Bearer {engine_api_key}"
    if dp_rank is not None:
        headers["X-data-parallel-rank"] = str(dp_rank)
    return headers


def prefill_leg(
    request: ClientRequest, prefill: Target, decode: Target, ids: TransferIds, engine_api_key: str | None
) -> Leg:
    """One token that cannot end the request, not streamed, D's address and sizes.

    ``min_tokens: 1`` masks every stop token for that token and keeps stop strings unchecked (vLLM's
    MinTokensLogitsProcessor and detokenizer), so prefill always finishes length-capped and returns KV;
    decode samples the first token itself (docs/proxy.md, "What each leg carries").
    docs/protocol.md#http-legs and docs/protocol.md#prefill-leg-params.
    """
    body = dict(request.body)
    body["stream"] = False
    body.pop("stream_options", None)
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    body["min_tokens"] = 1
    body.pop("min_completion_tokens", None)
    body.pop("return_token_ids", None)  # only the proxy reads prefill's answer: no prompt's ids to parse
    body["kv_transfer_params"] = prefill_leg_params(decode.instance, ids.transfer_id)
    return Leg(request.path, _headers(request, ids.request_id, prefill.dp_rank, engine_api_key), body)


def decode_leg(
    request: ClientRequest,
    prefill: Target,
    decode: Target,
    ids: TransferIds,
    policy: MaxTokensPolicy,
    engine_api_key: str | None,
    prefill_params: dict[str, Any] | None = None,
) -> Leg:
    """docs/protocol.md#decode-leg-params: the client's body plus P's address and sizes; streamed when the
    client's is, and when the client's answer is assembled from a stream (``streams_whole``).

    ``prefill_params`` is P's returned kv_transfer_params in read mode, None in write mode.
    """
    body = decode_token_limits(request.body, policy)
    assembled = streams_whole(request)
    if assembled:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    body["kv_transfer_params"] = decode_leg_params(
        prefill.instance,
        ids.transfer_id,
        prefill_response=prefill_params,
        prefill_dp_rank=prefill.dp_rank if prefill.instance.dp_size > 1 else None,
    )
    return Leg(request.path, _headers(request, ids.request_id, decode.dp_rank, engine_api_key), body, assembled)


# Whole answers that a stream of the same request does not carry: tool calls (vLLM parses them with a
# streaming parser then, not the whole text) and prompt logprobs (no stream chunk has them).
WHOLE_ONLY_KEYS = ("tools", "functions", "prompt_logprobs")


def streams_whole(request: ClientRequest) -> bool:
    """Whether a request that is not streamed has its decode leg streamed and its answer assembled
    (relay.whole_from_stream), so that decode's first byte shows that the KV came, as for a stream
    (docs/proxy.md, "Waiting for the KV"). Not when the client set ``stream_options`` (vLLM refuses them
    on a request that is not streamed: its 400 passes) or asked for what a stream lacks."""
    body = request.body
    return (
        not request.stream and body.get("stream_options") is None and not any(body.get(key) for key in WHOLE_ONLY_KEYS)
    )


def plain_leg(request: ClientRequest, target: Target, request_id: str, engine_api_key: str | None) -> Leg:
    """A request without KV transfer: colocated mode, and the read-mode fallback to decode-only."""
    return Leg(request.path, _headers(request, request_id, target.dp_rank, engine_api_key), dict(request.body))


def decode_token_limits(body: dict[str, Any], policy: MaxTokensPolicy) -> dict[str, Any]:
    """The decode leg's token limits under the configured policy (docs/proxy.md, "max_tokens").

    ``exact`` (default) forwards the client's limits unchanged: the decode engine recomputes the last
    prompt token and samples the first output token itself, P's token is discarded (docs/protocol.md#http-legs), so the
    client gets what it asked for. ``decrement`` mimics vLLM's toy proxy (limit - 1), floored at 1 so a
    request for one token never becomes an invalid ``max_tokens=0``. Absent limits stay absent.
    """
    out = dict(body)
    if policy == "decrement":
        for key in TOKEN_LIMIT_KEYS:
            if out.get(key) is not None:
                out[key] = max(1, out[key] - 1)
    return out
