"""Pure per-request judgement: TTFT, per-request ITL, and whether a request met the SLO.

Rules (documented in docs/goodput.md):
- ITL of one request = (t_last_token - t_first_token) / (completion_tokens - 1), with the server's
  ``usage.completion_tokens``; immune to several tokens arriving in one chunk.
- One-token rule: a reply with exactly one token has no inter-token gap, so its ITL is undefined (null).
  If exactly one token was asked for (``--output-tokens 1``) the request is judged on TTFT alone; if
  more were asked for, the SLO cannot be verified and the request fails as ``short_reply``.
- Errors, timeouts and replies without any token fail. ``good`` needs TTFT <= SLO and ITL <= SLO
  (inclusive, as DistServe and vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    itl_ms: float
    target: float
    """Attainment (fraction 0..1) a rate must reach to count as sustained."""


@dataclass(frozen=True)
class RequestTiming:
    """What the client observed for one request; times in seconds from the stage start."""

    index: int
    request_id: str
    warmup: bool
    scheduled_s: float
    sent_s: float
    end_s: float
    first_token_s: float | None = None
    last_token_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class RequestOutcome:
    """A judged request, as it appears in the result's ``records``."""

    index: int
    request_id: str
    sent_s: float
    lag_ms: float
    ttft_ms: float | None
    itl_ms: float | None
    e2e_ms: float
    prompt_tokens: int | None
    completion_tokens: int
    short: bool
    good: bool
    error: str | None


SHORT_REPLY = "short_reply: one token where more were asked for; ITL cannot be measured"
NO_TOKENS = "no_tokens: the stream ended without any token"


def request_itl_s(timing: RequestTiming) -> float | None:
    """Per-request mean inter-token latency in seconds; None when it is undefined."""
    if timing.first_token_s is None or timing.last_token_s is None or timing.completion_tokens < 2:
        return None
    return (timing.last_token_s - timing.first_token_s) / (timing.completion_tokens - 1)


def judge(timing: RequestTiming, slo: Slo, output_tokens: int) -> RequestOutcome:
    """Apply the SLO to one request (see the module docstring for the rules)."""
    error = _failure(timing, output_tokens)
    ttft_ms = None if timing.first_token_s is None else (timing.first_token_s - timing.sent_s) * 1e3
    itl_s = request_itl_s(timing)
    itl_ms = None if itl_s is None else itl_s * 1e3
    good = error is None and ttft_ms is not None and ttft_ms <= slo.ttft_ms and (itl_ms is None or itl_ms <= slo.itl_ms)
    return RequestOutcome(
        index=timing.index,
        request_id=timing.request_id,
        sent_s=timing.sent_s,
        lag_ms=(timing.sent_s - timing.scheduled_s) * 1e3,
        ttft_ms=ttft_ms if error is None else None,
        itl_ms=itl_ms if error is None else None,
        e2e_ms=(timing.end_s - timing.sent_s) * 1e3,
        prompt_tokens=timing.prompt_tokens,
        completion_tokens=timing.completion_tokens,
        short=0 < timing.completion_tokens < output_tokens,
        good=good,
        error=error,
    )


def _failure(timing: RequestTiming, output_tokens: int) -> str | None:
    if timing.error is not None:
        return timing.error
    if timing.first_token_s is None or timing.completion_tokens < 1:
        return NO_TOKENS
    if timing.completion_tokens == 1 and output_tokens > 1:
        return SHORT_REPLY
    return None
