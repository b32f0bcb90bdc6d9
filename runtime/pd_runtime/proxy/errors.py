"""OpenAI-style errors: every failure a client sees has the same body shape and a meaningful status;
and how an upstream leg failed (``LegFailure``), which says what the client is told.

The request path's failures have a cause each (``Cause``), and a cause has one status (docs/proxy.md,
"Failure contract"): the constructors below are the only place that pairs them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

Cause = Literal["no_instance", "overloaded", "engine_failed", "kv_transfer_failed", "deadline", "client_gone"]
"""Why a request that reached the engines' side of the proxy failed: the rows of the failure table."""
Phase = Literal["before_headers", "after_first_byte"]
"""Whether the client had its answer's status line when it failed: the columns of the failure table."""


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
        cause: Cause | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.raw_body = raw_body  # an engine's own 4xx body, passed through as is
        self.retry_after = retry_after  # seconds for Retry-After (a 503 without one says 1)
        self.cause = cause  # None: not a failure of the request path (a refused request, a shutdown)

    @property
    def outcome(self) -> str:
        """Its request's ``outcome`` in ``pd_proxy_requests_total`` when no leg failed (a leg's failure is
        ``<leg>_<kind>``)."""
        return {503: "unavailable", 429: "rate_limited", 504: "deadline"}.get(self.status, "rejected")

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


def no_instance(message: str, code: str) -> ApiError:
    """No live instance of a role to route to: 503 and Retry-After 1 (one may come back any moment)."""
    return ApiError(503, message, type="service_unavailable", code=code, cause="no_instance")


def overloaded(message: str, code: str, retry_after: int) -> ApiError:
    """Every slot is taken and the wait for one is full or over: 429, as OpenAI answers a rate limit, which
    its SDKs and every HTTP retry library retry after ``Retry-After`` (docs/proxy.md, "Failure contract")."""
    return ApiError(429, message, type="rate_limit_error", code=code, retry_after=retry_after, cause="overloaded")


def engine_failed(leg: str, message: str) -> ApiError:
    """An engine failed the request: refused or lost the connection, answered 5xx, or gave no answer within
    its leg's bound (a hung engine). Another instance may serve the same request: 502."""
    return ApiError(502, message, type="upstream_error", code=f"{leg}_failed", cause="engine_failed")


def kv_transfer_failed(message: str, code: str) -> ApiError:
    """Both engines answered, but the prompt's KV did not reach decode: 502 with its own error type."""
    return ApiError(502, message, type="kv_transfer_error", code=code, cause="kv_transfer_failed")


def deadline_exceeded(message: str) -> ApiError:
    """The request's one deadline (``--response-timeout``) passed: 504."""
    return ApiError(504, message, type="timeout_error", code="deadline_exceeded", cause="deadline")


def kv_transfer_timeout(kv_wait: float) -> ApiError:
    return kv_transfer_failed(
        f"decode got no KV within {kv_wait:g} s of prefill's answer: the transfer was dropped or is stuck "
        "(both legs aborted)",
        "kv_transfer_timeout",
    )


def decode_without_output() -> ApiError:
    return kv_transfer_failed(
        "decode engine ended its stream without a token or an error: it failed the request before its first "
        "token, as vLLM does when the request's KV cannot load (kv_load_failure_policy fail): in write mode "
        "from vLLM 0.33 when prefill gave up waiting for decode's block list after its defer_timeout "
        "(write_failed: decode had no room for the request in time), in read mode when the KV read failed",
        "kv_load_failed",
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
        answer within its leg's bound. Another instance of the role may well serve the same request."""
        return self.kind in ("unreachable", "broken", "timeout") or (self.kind == "http" and self.error.status >= 500)


class NoKvTransfer(LegFailure):
    """Prefill answered but its kv_transfer_params cannot feed a decode (e.g. the prefill was aborted)."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            "prefill", "no_kv", kv_transfer_failed(f"prefill produced no KV transfer: {problem}", "prefill_no_kv")
        )
