"""Pure: what becomes of a request whose leg failed (docs/proxy.md, "Failure contract").

``after_failure`` is the one decision, taken in one place (``flows.ProxyCore._after_failure``): before the
client has a byte the request may be served again elsewhere, else the client gets an HTTP error; after its
first byte it is never retried, and its stream ends with an OpenAI-style error event and ``[DONE]``.
Migrating a request in flight to another decode engine would be one more step here.
"""

from __future__ import annotations

from typing import Literal

from pd_runtime.proxy.errors import LegFailure, Phase

Step = Literal["fail_over", "answer_error", "end_stream"]


def phase(started: bool) -> Phase:
    """The failure table's column: whether the client had the answer's head (``Sink.started``)."""
    return "after_first_byte" if started else "before_headers"


def after_failure(failure: LegFailure, started: bool, canary: bool, failed_over: bool) -> Step:
    """``fail_over``: serve the request again as a new exchange (another instance of the failed role, if the
    caller finds one live); ``answer_error``: the client gets the failure as an HTTP error;
    ``end_stream``: as an error event after the tokens it has, then ``[DONE]``.

    Served again only while nothing reached the client, only after a failed engine (not a refusal, a lost
    KV transfer or the request's deadline), only once, and never for the canary (it reports what it met)."""
    if started:
        return "end_stream"
    if failure.engine_failed and not canary and not failed_over:
        return "fail_over"
    return "answer_error"
