"""Contract tests for pd_runtime.protocol against the literal formats of docs/protocol.md.

Expected values are written out by hand from docs/protocol.md (its anchors in comments), never
computed with the module under test, so a mistake in protocol.py cannot hide behind itself.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest

from pd_runtime import protocol

PREFILL = protocol.Registration("P", "10.0.0.1", 20005, 6301, 6105, 1, 4, "WRITE", "G2")
DECODE = protocol.Registration("D", "10.0.0.2", 40005, 7301, 7501, 1, 4, "WRITE", "G2")
UID = "0123456789abcdef0123456789abcdef"

# docs/protocol.md#request-ids, verbatim from vLLM's moriio_common.py.
REFERENCE_ID = (
    "___prefill_addr_host:10.0.0.1,handshake:6301,notify:6105"
    "___decode_addr_host:10.0.0.2,handshake:7301,notify:7501_0123456789abcdef0123456789abcdef"
)
ENGINE_PREFILL_RE = re.compile(r"___prefill_addr_(.+?)___decode_addr_")
ENGINE_DECODE_RE = re.compile(r"___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$")


def unpack(frame: bytes) -> Any:
    return msgpack.unpackb(frame, raw=False)


def test_seed_default_ports() -> None:
    # docs/protocol.md#ports and the seed's appendix.
    assert protocol.REGISTRATION_PORT == 36367
    assert (protocol.PREFILL_PORTS.http, protocol.PREFILL_PORTS.handshake, protocol.PREFILL_PORTS.notify) == (
        20005,
        6301,
        6105,
    )
    assert (protocol.DECODE_PORTS.http, protocol.DECODE_PORTS.handshake, protocol.DECODE_PORTS.notify) == (
        40005,
        7301,
        7501,
    )


def test_g2_registration_payload_is_exactly_the_reference() -> None:
    # docs/protocol.md#registration-g2
    assert unpack(protocol.encode_frame(protocol.g2_payload(PREFILL))) == {
        "type": "P",
        "http_address": "10.0.0.1:20005",
        "zmq_address": "host:10.0.0.1,handshake:6301,notify:6105",
        "dp_size": 1,
        "tp_size": 4,
        "transfer_mode": "WRITE",
    }


def test_g1_registration_payload_is_exactly_the_reference() -> None:
    # docs/protocol.md#registration-g1
    assert unpack(protocol.encode_frame(protocol.g1_payload(DECODE, 17))) == {
        "type": "register",
        "role": "D",
        "index": "17",
        "request_address": "http://10.0.0.2:40005/v1/completions",
        "handshake_port": 7301,
        "notify_port": 7501,
        "dp_size": 1,
        "tp_size": 4,
        "transfer_mode": "WRITE",
    }


def test_parse_literal_g2_and_g1_frames() -> None:
    g2 = msgpack.packb(
        {
            "type": "D",
            "http_address": "10.0.0.2:40005",
            "zmq_address": "host:10.0.0.2,handshake:7301,notify:7501",
            "dp_size": 1,
            "tp_size": 4,
            "transfer_mode": "READ",
        }
    )
    reg = protocol.parse_registration(g2)
    assert reg is not None
    assert (reg.role, reg.http_address, reg.base_url, reg.generation) == (
        "D",
        "10.0.0.2:40005",
        "http://10.0.0.2:40005",
        "G2",
    )
    assert (reg.handshake_port, reg.notify_port, reg.transfer_mode) == (7301, 7501, "READ")

    g1 = msgpack.packb(
        {
            "type": "register",
            "role": "P",
            "index": "3",
            "request_address": "http://10.0.0.1:20005/v1/completions",
            "handshake_port": 6301,
            "notify_port": 6105,
            "dp_size": 2,
            "tp_size": 4,
            "transfer_mode": "WRITE",
        }
    )
    reg1 = protocol.parse_registration(g1)
    assert reg1 is not None
    assert (reg1.role, reg1.http_address, reg1.zmq_address, reg1.dp_size, reg1.generation) == (
        "P",
        "10.0.0.1:20005",
        "host:10.0.0.1,handshake:6301,notify:6105",
        2,
        "G1",
    )


def test_hello_is_ignored() -> None:
    assert protocol.parse_registration(msgpack.packb({"type": "HELLO"})) is None


def test_ipv6_zmq_address_splits_on_first_colon() -> None:
    # docs/protocol.md#registration-g2: "split on the first colon, so host:::1 works for IPv6"
    assert protocol.parse_zmq_address("host:::1,handshake:6301,notify:6105") == {
        "host": "::1",
        "handshake": "6301",
        "notify": "6105",
    }


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1\xff garbage",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"type": "X"}),
        msgpack.packb({"type": "P", "http_address": "h:1"}),
        msgpack.packb(
            {
                "type": "P",
                "http_address": "h:1",
                "zmq_address": "nonsense",
                "dp_size": 1,
                "tp_size": 1,
                "transfer_mode": "WRITE",
            }
        ),
        msgpack.packb(
            {
                "type": "P",
                "http_address": "h:99999",
                "zmq_address": "host:h,handshake:1,notify:2",
                "dp_size": 1,
                "tp_size": 1,
                "transfer_mode": "WRITE",
            }
        ),
        msgpack.packb(
            {
                "type": "P",
                "http_address": "h:1",
                "zmq_address": "host:h,handshake:1,notify:2",
                "dp_size": 0,
                "tp_size": 1,
                "transfer_mode": "WRITE",
            }
        ),
        msgpack.packb(
            {
                "type": "D",
                "http_address": "h:1",
                "zmq_address": "host:h,handshake:1,notify:2",
                "dp_size": 1,
                "tp_size": 1,
                "transfer_mode": "PUSH",
            }
        ),
        msgpack.packb({"type": "register", "role": "X"}),
    ],
)
def test_malformed_frames_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_registration(frame)


def test_request_id_matches_reference_and_engine_regexes() -> None:
    rid = protocol.make_request_id(PREFILL, DECODE, UID)
    assert rid == REFERENCE_ID
    assert ENGINE_PREFILL_RE.search(rid)[1] == "host:10.0.0.1,handshake:6301,notify:6105"  # type: ignore[index]
    # vLLM appends "-<n>-<8hex>" suffixes; the decode regex tolerates them (docs/protocol.md#request-ids).
    assert ENGINE_DECODE_RE.search(rid + "-0-1a2b3c4d")[1] == "host:10.0.0.2,handshake:7301,notify:7501"  # type: ignore[index]


def test_peer_lookup_by_role() -> None:
    # P takes the decode address, D the prefill address (docs/protocol.md#request-ids).
    assert protocol.peer_from_request_id(REFERENCE_ID, "P") == protocol.PeerAddress("10.0.0.2", 7301, 7501)
    assert protocol.peer_from_request_id("cmpl-" + REFERENCE_ID + "-0", "D") == protocol.PeerAddress(
        "10.0.0.1", 6301, 6105
    )
    assert protocol.peer_from_request_id("plain-id", "P") is None


def test_ids_have_the_required_shapes() -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", protocol.new_request_uid())
    assert re.fullmatch(
        r"tx-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", protocol.new_transfer_id()
    )


def test_prefill_leg_params() -> None:
    # docs/protocol.md#prefill-leg-params (G2 keys, plus G1b's explicit peer keys, plus both TP keys).
    assert protocol.prefill_leg_params(DECODE, "tx-1") == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": "10.0.0.2",
        "remote_port": "40005",
        "remote_handshake_port": 7301,
        "remote_notify_port": 7501,
        "remote_dp_size": 1,
        "remote_tp_size": 4,
        "tp_size": 4,
        "transfer_id": "tx-1",
    }


def test_decode_leg_params_write_and_read() -> None:
    # docs/protocol.md#decode-leg-params
    write = protocol.decode_leg_params(PREFILL, "tx-1")
    assert write["do_remote_decode"] is False and write["do_remote_prefill"] is True
    assert write["remote_engine_id"] is None and write["remote_block_ids"] is None
    assert (write["remote_host"], write["remote_port"], write["remote_handshake_port"]) == ("10.0.0.1", "20005", 6301)
    assert (write["remote_notify_port"], write["remote_dp_size"], write["remote_tp_size"], write["tp_size"]) == (
        6105,
        1,
        4,
        4,
    )
    assert write["transfer_id"] == "tx-1" and "remote_dp_rank" not in write

    p_resp = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [4, 5, 6],
        "remote_engine_id": "10.0.0.1:6301",
        "transfer_id": "tx-1",
    }
    read = protocol.decode_leg_params(PREFILL, "tx-1", p_resp, prefill_dp_rank=1)
    assert read["remote_engine_id"] == "10.0.0.1:6301"
    assert read["remote_block_ids"] == [4, 5, 6]
    assert read["remote_dp_rank"] == 1


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        (None, "no kv_transfer_params"),
        ([], "not an object"),
        ({"do_remote_prefill": False}, "do_remote_prefill"),
        ({"do_remote_prefill": True, "transfer_id": "tx-2", "remote_block_ids": [1]}, "another transfer_id"),
        ({"do_remote_prefill": True, "remote_block_ids": []}, "integer remote_block_ids"),
        ({"do_remote_prefill": True, "remote_block_ids": ["1"]}, "integer remote_block_ids"),
        ({"do_remote_prefill": True, "remote_block_ids": [[]]}, "integer remote_block_ids"),
        ({"do_remote_prefill": True, "remote_block_ids": [[1], 2]}, "integer remote_block_ids"),
        ({"do_remote_prefill": True, "remote_block_ids": [1]}, "remote_engine_id"),
    ],
)
def test_prefill_response_validation(params: Any, reason: str) -> None:
    problem = protocol.check_prefill_response(params, "tx-1")
    assert problem is not None and reason in problem


def test_valid_prefill_response_passes() -> None:
    params = protocol.producer_response_params("10.0.0.1", 6301, 6105, [1, 2], 1, 4, "tx-1")
    # docs/protocol.md#prefill-answer G2 keys.
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [1, 2],
        "remote_engine_id": "10.0.0.1:6301",
        "remote_host": "10.0.0.1",
        "remote_handshake_port": 6301,
        "remote_notify_port": 6105,
        "remote_dp_size": 1,
        "tp_size": 4,
        "transfer_id": "tx-1",
    }
    assert protocol.check_prefill_response(params, "tx-1") is None


def test_block_ids_grouped_per_kv_cache_group_pass() -> None:
    """vLLM 0.31 and later return one list of block ids per KV-cache group."""
    params = protocol.producer_response_params("10.0.0.1", 6301, 6105, [1, 2], 1, 4, "tx-1")
    params["remote_block_ids"] = [[1, 2], [7]]
    assert protocol.check_prefill_response(params, "tx-1") is None


def test_notify_messages() -> None:
    # docs/protocol.md#notify-messages (G2 / G1b)
    assert unpack(protocol.remote_blocks_message("cmpl-x-0", "tx-1", [7, 8], 0)) == {
        "req_id": "cmpl-x-0",
        "transfer_id": "tx-1",
        "block_notify_list": [7, 8],
        "decode_rank": 0,
        "type": "remote_blocks",
    }
    assert unpack(protocol.write_done_message("tx-1")) == {"type": "write_done", "transfer_id": "tx-1"}
    assert unpack(protocol.release_message("tx-1", 4)) == {
        "type": "release",
        "transfer_id": "tx-1",
        "consumer_tp_size": 4,
    }


def test_parse_notify_accepts_maps_and_raw_strings() -> None:
    assert protocol.parse_notify(msgpack.packb({"type": "write_done", "transfer_id": "tx-1"})) == {
        "type": "write_done",
        "transfer_id": "tx-1",
    }
    assert protocol.parse_notify(b"tx-legacy") == "tx-legacy"
    for bad in (
        b"",
        b"\xff\xfe",
        msgpack.packb({"type": "nope", "transfer_id": "tx"}),
        msgpack.packb({"type": "release"}),
    ):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_notify(bad)


def test_side_channel_port_offsets() -> None:
    # docs/protocol.md#rank-ports: base + dp_rank + tp_rank
    assert protocol.side_channel_port(6301) == 6301
    assert protocol.side_channel_port(6301, dp_rank=0, tp_rank=3) == 6304
    assert protocol.side_channel_port(6105, dp_rank=2, tp_rank=0) == 6107
