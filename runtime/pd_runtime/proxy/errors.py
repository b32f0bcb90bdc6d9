"""OpenAI-style errors: every failure a client sees has the same body shape and a meaningful status;
and how an upstream leg failed (``LegFailure``), which says what the client is told."""

from __future__ import annotations

import json
from typing import Any


class ApiError(Exception):
    """An error answered to the client as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        raw_body: bytes | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.raw_body = raw_body  # an engine's own 4xx body, passed through as is
        self.retry_after = retry_after  # seconds for Retry-After (a 503 without one says 1)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """A 503 or 429 tells clients when to come back instead of treating the proxy as broken."""
        headers = {"Content-Type": "application/json"}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        elif self.status == 503:
            headers["Retry-After"] = "1"
        return headers

    def json_bytes(self) -> bytes:
        if self.raw_body is not None:
            return self.raw_body
        return json.dumps(self.body()).encode()

    def sse_bytes(self) -> bytes:
        """The error as a stream event followed by the end marker, as vLLM ends a failed stream."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\ndata: [DONE]\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str, code: str) -> ApiError:
    return ApiError(503, message, type="service_unavailable", code=code)


def upstream_failed(message: str, code: str = "upstream_error") -> ApiError:
    return ApiError(502, message, type="upstream_error", code=code)


def upstream_timeout(message: str) -> ApiError:
    return ApiError(504, message, type="upstream_error", code="upstream_timeout")


def kv_transfer_timeout(kv_wait: float) -> ApiError:
    return ApiError(
        504,
        f"decode got no KV within {kv_wait:g} s of prefill's answer: the transfer was dropped or is stuck "
        "(both legs aborted)",
        type="upstream_error",
        code="kv_transfer_timeout",
    )


def decode_without_output() -> ApiError:
    return upstream_failed(
        "decode engine ended its stream without a token or an error: it failed the request before its first "
        "token, as vLLM does when the request's KV cannot load (kv_load_failure_policy fail): in write mode "
        "from vLLM 0.33 when prefill gave up waiting for decode's block list after its defer_timeout "
        "(write_failed: decode had no room for the request in time), in read mode when the KV read failed",
        "decode_failed",
    )


class LegFailure(Exception):
    """An upstream leg failed; ``error`` is what the client is told."""

    def __init__(self, leg: str, kind: str, error: ApiError) -> None:
        super().__init__(f"{leg} {kind}: {error.message}")
        self.leg = leg
        self.kind = kind
        self.error = error

    @property
    def engine_failed(self) -> bool:
        """The engine failed, not the request: no connection, a connection lost, an HTTP 5xx, or no
        answer in time. Another instance of the role may well serve the same request."""
        return self.kind in ("unreachable", "broken", "timeout") or (self.kind == "http" and self.error.status >= 500)


class NoKvTransfer(LegFailure):
    """Prefill answered but its kv_transfer_params cannot feed a decode (e.g. the prefill was aborted)."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            "prefill", "no_kv", upstream_failed(f"prefill produced no KV transfer: {problem}", "prefill_no_kv")
        )
