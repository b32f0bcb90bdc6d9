"""MoRI-IO wire formats shared by the proxy and the simulated engine.

One definition per fact: default ports, registration payloads (G1/G1b and G2), the X-Request-Id that
carries peer addresses, transfer ids, each leg's ``kv_transfer_params`` and the engine-to-engine notify
messages. Everything here is pure and follows docs/protocol.md (its anchors
in the docstrings). Contract tests check the literal formats independently of this module, so a mistake
here cannot make the proxy and the simulator agree with each other and disagree with vLLM.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

Role = Literal["P", "D"]
TransferMode = Literal["WRITE", "READ"]
Generation = Literal["G1", "G2"]

# docs/protocol.md#ports / the seed's experiment: the ports every example and default uses.
REGISTRATION_PORT = 36367


@dataclass(frozen=True)
class RolePorts:
    """The three base ports of one engine instance (docs/protocol.md#rank-ports: side channels add rank offsets)."""

    http: int
    handshake: int
    notify: int


PREFILL_PORTS = RolePorts(http=20005, handshake=6301, notify=6105)
DECODE_PORTS = RolePorts(http=40005, handshake=7301, notify=7501)

# docs/protocol.md#constants MoRIIOConstants.
PING_INTERVAL_S: dict[Generation, float] = {"G1": 5.0, "G2": 3.0}
TRANSFER_PREFIX = "tx"
GET_META_MSG = b"get_meta_msg"
POP_DONE_RECV = b"pop_done_recv"
DEFAULT_TRANSFER_TIMEOUT_S = 30.0
DEFAULT_DEFER_TIMEOUT_S = 60.0
# After prefill's answer a decode can get its KV for at most defer_timeout + transfer_timeout (engine time);
# the proxy waits that plus this much wall time for what does not scale: notifies, a decode step, HTTP.
KV_WAIT_MARGIN_S = 5.0

# docs/protocol.md#request-ids: the engines' own regexes; the trailing id must be exactly 32 lowercase hex characters.
PREFILL_ZMQ_RE = re.compile(r"___prefill_addr_(.+?)___decode_addr_")
DECODE_ZMQ_RE = re.compile(r"___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$")


class ProtocolError(ValueError):
    """A frame or identifier that does not follow the MoRI-IO protocol."""


def side_channel_port(base: int, dp_rank: int = 0, tp_rank: int = 0) -> int:
    """docs/protocol.md#rank-ports: listeners bind ``base + dp_rank + tp_rank``."""
    return base + dp_rank + tp_rank


# ---------------------------------------------------------------------------------------------
# Registration (docs/protocol.md#registration)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """One engine instance as it announces itself to the proxy, whatever the generation."""

    role: Role
    host: str  # side-channel (handshake/notify) host, advertised in zmq_address
    http_port: int
    handshake_port: int
    notify_port: int
    dp_size: int
    tp_size: int
    transfer_mode: TransferMode
    generation: Generation
    http_host: str = ""  # HTTP host when it differs from ``host``; empty means the same
    http_address: str = field(init=False, repr=False, compare=False)
    """``host:port`` without scheme, the registry key (docs/protocol.md#registration-g2). Read several times
    per proxied request, so set once: compiled by mypyc, a ``cached_property`` built it on every read."""
    zmq_address: str = field(init=False, repr=False, compare=False)
    """``host:IP,handshake:P,notify:P``, split at first colons so IPv6 works (docs/protocol.md#registration-g2).
    Set once like ``http_address``: it is in every request's X-Request-Id, read twice per request."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "http_address", f"{_bracket_ipv6(self.http_host or self.host)}:{self.http_port}")
        object.__setattr__(
            self, "zmq_address", f"host:{self.host},handshake:{self.handshake_port},notify:{self.notify_port}"
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.http_address}"


def _bracket_ipv6(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def g2_payload(reg: Registration) -> dict[str, Any]:
    """docs/protocol.md#registration-g2: the current heartbeat body."""
    return {
        "type": reg.role,
        "http_address": reg.http_address,
        "zmq_address": reg.zmq_address,
        "dp_size": reg.dp_size,
        "tp_size": reg.tp_size,
        "transfer_mode": reg.transfer_mode,
    }


def g1_payload(reg: Registration, index: int) -> dict[str, Any]:
    """docs/protocol.md#registration-g1: the G1/G1b heartbeat body; ``index`` counts beats and is ignored by proxies."""
    return {
        "type": "register",
        "role": reg.role,
        "index": str(index),
        "request_address": f"{reg.base_url}/v1/completions",
        "handshake_port": reg.handshake_port,
        "notify_port": reg.notify_port,
        "dp_size": reg.dp_size,
        "tp_size": reg.tp_size,
        "transfer_mode": reg.transfer_mode,
    }


def encode_frame(payload: dict[str, Any]) -> bytes:
    """docs/protocol.md#registration-socket: one single-frame msgpack message per beat."""
    packed: bytes = msgpack.packb(payload, use_bin_type=True)
    return packed


def parse_zmq_address(text: str) -> dict[str, str]:
    """docs/protocol.md#registration-g2: comma-separated ``key:value`` pairs, each split on its first colon."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition(":")
        if not sep or not key or not value:
            raise ProtocolError(f"zmq_address part {part!r} is not key:value")
        fields[key.strip()] = value.strip()
    missing = {"host", "handshake", "notify"} - fields.keys()
    if missing:
        raise ProtocolError(f"zmq_address lacks {', '.join(sorted(missing))}")
    return fields


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ProtocolError(f"address {address!r} is not host:port")
    return host.strip("[]"), _port(port, "port")


def _port(value: Any, name: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{name} {value!r} is not an integer") from exc
    if not 0 < port < 65536:
        raise ProtocolError(f"{name} {port} is out of range")
    return port


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProtocolError(f"{name} must be a positive integer, got {value!r}")
    return value


def _mode(value: Any) -> TransferMode:
    if value not in ("WRITE", "READ"):
        raise ProtocolError(f"transfer_mode must be WRITE or READ, got {value!r}")
    mode: TransferMode = value
    return mode


def parse_registration(frame: bytes) -> Registration | None:
    """Decode one heartbeat frame (G2 or G1/G1b).

    Returns None for the legacy ``{"type": "HELLO"}`` keep-alive, which proxies accept and ignore;
    raises ProtocolError for anything malformed, so the caller can count and drop it.
    """
    try:
        data = msgpack.unpackb(frame, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"frame is not msgpack: {exc}") from exc
    if isinstance(data, dict) and data.get("type") == "HELLO":
        return None
    return registration_from_map(data)


def registration_from_map(data: Any) -> Registration:
    """A decoded G2 or G1/G1b heartbeat body (the proxy's list of expected engines uses the G2 form too)."""
    if not isinstance(data, dict):
        raise ProtocolError(f"registration is a {type(data).__name__}, not a map")
    kind = data.get("type")
    if kind in ("P", "D"):
        return _parse_g2(data, kind)
    if kind == "register":
        return _parse_g1(data)
    raise ProtocolError(f"unknown registration type {kind!r}")


def _parse_g2(data: dict[str, Any], role: Role) -> Registration:
    missing = {"http_address", "zmq_address", "dp_size", "tp_size", "transfer_mode"} - data.keys()
    if missing:
        raise ProtocolError(f"G2 registration lacks {', '.join(sorted(missing))}")
    if not isinstance(data["http_address"], str) or not isinstance(data["zmq_address"], str):
        raise ProtocolError("http_address and zmq_address must be strings")
    host, http_port = _split_host_port(data["http_address"])
    zmq = parse_zmq_address(data["zmq_address"])
    return Registration(
        role=role,
        host=zmq["host"],
        http_port=http_port,
        handshake_port=_port(zmq["handshake"], "handshake port"),
        notify_port=_port(zmq["notify"], "notify port"),
        dp_size=_positive(data["dp_size"], "dp_size"),
        tp_size=_positive(data["tp_size"], "tp_size"),
        transfer_mode=_mode(data["transfer_mode"]),
        generation="G2",
        http_host="" if host == zmq["host"] else host,
    )


_G1_REQUEST_ADDRESS_RE = re.compile(r"^https?://(?P<addr>[^/]+)(?:/.*)?$")


def _parse_g1(data: dict[str, Any]) -> Registration:
    required = {"role", "request_address", "handshake_port", "notify_port", "dp_size", "tp_size", "transfer_mode"}
    missing = required - data.keys()
    if missing:
        raise ProtocolError(f"G1 registration lacks {', '.join(sorted(missing))}")
    role = data["role"]
    if role not in ("P", "D"):
        raise ProtocolError(f"G1 role must be P or D, got {role!r}")
    match = _G1_REQUEST_ADDRESS_RE.match(str(data["request_address"]))
    if match is None:
        raise ProtocolError(f"request_address {data['request_address']!r} is not an http URL")
    host, http_port = _split_host_port(match["addr"])
    return Registration(
        role=role,
        host=host,
        http_port=http_port,
        handshake_port=_port(data["handshake_port"], "handshake_port"),
        notify_port=_port(data["notify_port"], "notify_port"),
        dp_size=_positive(data["dp_size"], "dp_size"),
        tp_size=_positive(data["tp_size"], "tp_size"),
        transfer_mode=_mode(data["transfer_mode"]),
        generation="G1",
    )


# ---------------------------------------------------------------------------------------------
# Request ids (docs/protocol.md#request-ids)
# ---------------------------------------------------------------------------------------------


def _uuid4_hex() -> str:
    """A random (version 4) UUID's 32 hex digits, without building a uuid.UUID (two per request showed in
    the proxy's profile): the same 122 random bits from os.urandom, the version and variant bits set."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


def new_request_uid() -> str:
    """32 lowercase hex characters, the tail the engines' regex requires."""
    return _uuid4_hex()


def new_transfer_id() -> str:
    """``tx-<uuid4 with dashes>``: G1b engines require the ``tx`` prefix."""
    h = _uuid4_hex()
    return f"{TRANSFER_PREFIX}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def make_request_id(prefill: Registration, decode: Registration, uid: str) -> str:
    """The X-Request-Id sent on both legs.

    G2 engines find their peer in it; G1 engines treat it as an opaque id and use the explicit
    remote_* keys instead, so the G2 form serves both.
    """
    return f"___prefill_addr_{prefill.zmq_address}___decode_addr_{decode.zmq_address}_{uid}"


@dataclass(frozen=True)
class PeerAddress:
    host: str
    handshake_port: int
    notify_port: int


def peer_from_request_id(request_id: str, own_role: Role) -> PeerAddress | None:
    """What an engine of ``own_role`` reads from X-Request-Id: P reads the decode address, D the prefill."""
    pattern = DECODE_ZMQ_RE if own_role == "P" else PREFILL_ZMQ_RE
    match = pattern.search(request_id)
    if match is None:
        return None
    fields = parse_zmq_address(match.group(1))
    return PeerAddress(
        host=fields["host"],
        handshake_port=_port(fields["handshake"], "handshake port"),
        notify_port=_port(fields["notify"], "notify port"),
    )


def peer_from_params(params: dict[str, Any]) -> PeerAddress | None:
    """The explicit remote_* keys (G1/G1b, and the G2 fallback), if all are present."""
    keys = ("remote_host", "remote_handshake_port", "remote_notify_port")
    if not all(params.get(key) not in (None, "") for key in keys):
        return None
    return PeerAddress(
        host=str(params["remote_host"]),
        handshake_port=_port(params["remote_handshake_port"], "remote_handshake_port"),
        notify_port=_port(params["remote_notify_port"], "remote_notify_port"),
    )


# ---------------------------------------------------------------------------------------------
# kv_transfer_params (docs/protocol.md#prefill-leg-params, docs/protocol.md#prefill-answer)
# ---------------------------------------------------------------------------------------------


def _explicit_peer_keys(peer: Registration) -> dict[str, Any]:
    """G1/G1b engines need the peer's address as explicit keys (G2 engines fall back to them)."""
    return {
        "remote_host": peer.host,
        "remote_port": str(peer.http_port),
        "remote_handshake_port": peer.handshake_port,
        "remote_notify_port": peer.notify_port,
    }


def prefill_leg_params(decode: Registration, transfer_id: str) -> dict[str, Any]:
    """docs/protocol.md#prefill-leg-params: what the proxy sends the producer."""
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        **_explicit_peer_keys(decode),
        "remote_dp_size": decode.dp_size,
        "remote_tp_size": decode.tp_size,
        "tp_size": decode.tp_size,
        "transfer_id": transfer_id,
    }


def decode_leg_params(
    prefill: Registration,
    transfer_id: str,
    prefill_response: dict[str, Any] | None = None,
    prefill_dp_rank: int | None = None,
) -> dict[str, Any]:
    """docs/protocol.md#decode-leg-params: what the proxy sends the consumer.

    In write mode ``prefill_response`` is None (D learns the blocks over the notify channel); in read
    mode it is the producer's returned ``kv_transfer_params``, whose engine id, block ids and transfer id
    the consumer needs.
    """
    params: dict[str, Any] = {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": None,
        "remote_block_ids": None,
        **_explicit_peer_keys(prefill),
        "remote_dp_size": prefill.dp_size,
        "remote_tp_size": prefill.tp_size,
        "tp_size": prefill.tp_size,
        "transfer_id": transfer_id,
    }
    if prefill_response is not None:
        params["remote_engine_id"] = prefill_response.get("remote_engine_id")
        params["remote_block_ids"] = prefill_response.get("remote_block_ids")
        params["transfer_id"] = prefill_response.get("transfer_id", transfer_id)
    if prefill_dp_rank is not None:
        params["remote_dp_rank"] = prefill_dp_rank
    return params


def check_prefill_response(params: Any, transfer_id: str) -> str | None:
    """Why a producer's returned kv_transfer_params cannot feed a read-mode decode, or None.

    docs/protocol.md#prefill-answer says what a usable answer holds.
    """
    if params is None:
        return "prefill returned no kv_transfer_params (the prefill was aborted or did not end length-capped)"
    if not isinstance(params, dict):
        return "prefill kv_transfer_params is not an object"
    if params.get("do_remote_prefill") is not True:
        return "prefill kv_transfer_params has do_remote_prefill != true"
    if params.get("transfer_id", transfer_id) != transfer_id:
        return "prefill kv_transfer_params carries another transfer_id"
    if not _block_ids(params.get("remote_block_ids")):
        return "prefill kv_transfer_params has no list of integer remote_block_ids"
    if not params.get("remote_engine_id"):
        return "prefill kv_transfer_params has no remote_engine_id"
    return None


def _block_ids(blocks: Any) -> bool:
    """Non-empty block ids: one list of ints (vLLM before 0.31) or one such list per KV-cache group (0.31 on)."""
    if not isinstance(blocks, list) or not blocks:
        return False
    groups = blocks if all(isinstance(g, list) for g in blocks) else [blocks]
    return any(groups) and all(isinstance(b, int) and not isinstance(b, bool) for g in groups for b in g)


def producer_response_params(
    host: str,
    handshake_port: int,
    notify_port: int,
    block_ids: list[int],
    dp_size: int,
    tp_size: int,
    transfer_id: str,
) -> dict[str, Any]:
    """docs/protocol.md#prefill-answer (G2): what a producer returns after a length-capped one-token prefill."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": block_ids,
        "remote_engine_id": f"{host}:{handshake_port}",
        "remote_host": host,
        "remote_handshake_port": handshake_port,
        "remote_notify_port": notify_port,
        "remote_dp_size": dp_size,
        "tp_size": tp_size,
        "transfer_id": transfer_id,
    }


# ---------------------------------------------------------------------------------------------
# Notify messages (docs/protocol.md#notify-messages, G2)
# ---------------------------------------------------------------------------------------------

NotifyType = Literal["remote_blocks", "write_done", "write_failed", "release"]


def remote_blocks_message(req_id: str, transfer_id: str, block_ids: list[int], decode_rank: int) -> bytes:
    """WRITE: D gives P its block ids (``req_id`` is required by the G1b dispatcher)."""
    return encode_frame(
        {
            "req_id": req_id,
            "transfer_id": transfer_id,
            "block_notify_list": block_ids,
            "decode_rank": decode_rank,
            "type": "remote_blocks",
        }
    )


def write_done_message(transfer_id: str, num_writers: int = 1) -> bytes:
    """WRITE: P tells D that every layer landed; with ``num_writers`` prefill ranks writing into one decode
    rank (vLLM 0.33's fan-in), the rank has its KV once that many arrived (sent only when not 1)."""
    message: dict[str, Any] = {"type": "write_done", "transfer_id": transfer_id}
    if num_writers != 1:
        message["num_writers"] = num_writers
    return encode_frame(message)


def write_failed_message(transfer_id: str) -> bytes:
    """WRITE, vLLM 0.33 on: P gave up waiting for D's block list (``defer_timeout``); D fails the request."""
    return encode_frame({"type": "write_failed", "transfer_id": transfer_id})


def _rank_heads(rank: int, tp: int, kv_heads: int) -> range:
    """vLLM's KV-head sharding: rank i holds heads [i*n, (i+1)*n), or one replicated head past kv_heads."""
    if tp <= kv_heads:
        per = kv_heads // tp
        return range(rank * per, (rank + 1) * per)
    head = rank * kv_heads // tp
    return range(head, head + 1)


def write_targets(prefill_rank: int, prefill_tp: int, decode_tp: int, kv_heads: int) -> list[tuple[int, int]]:
    """(decode rank, num_writers) that prefill rank ``prefill_rank`` writes and sends ``write_done`` to, as
    vLLM 0.33's ``moriio_tp_mapping.compute_write_tp_mapping`` (attention KV, no MLA): fan-out, rank p feeds
    decode ranks p*r .. p*r+r-1; fan-in, decode rank d is fed by prefill ranks d*r .. d*r+r-1, of which only
    the first holder of each head writes. ValueError when neither TP size is a multiple of the other."""
    larger, smaller = max(prefill_tp, decode_tp), min(prefill_tp, decode_tp)
    if smaller <= 0 or larger % smaller:
        raise ValueError(f"write mode needs one TP size a multiple of the other: {prefill_tp} and {decode_tp}")
    if decode_tp >= prefill_tp:
        ratio = decode_tp // prefill_tp
        return [(prefill_rank * ratio + j, 1) for j in range(ratio)]
    ratio = prefill_tp // decode_tp
    decode_rank = prefill_rank // ratio
    group = range(decode_rank * ratio, (decode_rank + 1) * ratio)
    starts = [_rank_heads(p, prefill_tp, kv_heads).start for p in group]
    own = _rank_heads(prefill_rank, prefill_tp, kv_heads).start
    if starts.index(own) != prefill_rank - group.start:
        return []  # another rank of the group holds (and writes) the same heads
    return [(decode_rank, len(set(starts)))]


def release_message(transfer_id: str, consumer_tp_size: int) -> bytes:
    """READ (and WRITE aborts): D tells P it may free the blocks."""
    return encode_frame({"type": "release", "transfer_id": transfer_id, "consumer_tp_size": consumer_tp_size})


def parse_notify(frame: bytes) -> dict[str, Any] | str:
    """docs/protocol.md#notify-listener: msgpack map first; otherwise a raw UTF-8 completion string (G1/G1b)."""
    try:
        data = msgpack.unpackb(frame, raw=False)
    except Exception:
        data = None
    if isinstance(data, dict):
        if data.get("type") not in ("remote_blocks", "write_done", "write_failed", "release"):
            raise ProtocolError(f"unknown notify type {data.get('type')!r}")
        if not isinstance(data.get("transfer_id"), str):
            raise ProtocolError("notify message lacks a string transfer_id")
        return data
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError("notify frame is neither msgpack nor UTF-8") from exc
    if not text:
        raise ProtocolError("empty notify frame")
    return text
