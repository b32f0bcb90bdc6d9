"""Pure: is the KV that reached decode the KV prefill computed? The canary's comparison (docs/proxy.md).

The canary sends one greedy request (temperature 0, ``ignore_eos``, a fixed ``max_tokens``) through
P->D and the same request to the prefill engine as a plain request, which computes it whole. Greedy
decoding is deterministic, so the two answers' token ids must be equal: a decode engine that got wrong
KV (bytes corrupted, dropped or written to the wrong blocks) answers HTTP 200 with other tokens. Token
ids, not text: two ids can decode to one string, and vLLM returns them when asked (``return_token_ids``,
added by vLLM PR #22587 in August 2025; in 0.31 ``vllm/entrypoints/openai/completion/protocol.py``; the
simulator too).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pd_runtime.proxy.status import rfc3339

OnKvMismatch = Literal["report", "stopServing"]
CANARY_MAX_TOKENS = 8


def canary_body(model: str, prompt: str) -> dict[str, Any]:
    """The canary's completions body: the same for the P->D request and the reference."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": CANARY_MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # an EOS first token would end the request on prefill: no transfer to check
        "return_token_ids": True,
        "stream": False,
    }


class Unusable(ValueError):
    """An answer the comparison cannot use; the message says why."""


def token_ids(document: Any, which: str) -> list[int]:
    """``choices[0].token_ids`` of a completions answer."""
    try:
        ids = document["choices"][0]["token_ids"]
    except (KeyError, IndexError, TypeError):
        ids = None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise Unusable(f"{which} answer has no choices[0].token_ids (the engine ignores return_token_ids?)")
    return ids


@dataclass(frozen=True)
class Comparison:
    """Decode's ids against prefill's own. Over the shorter answer: the decode leg may be one token short
    (``--max-tokens-policy decrement``)."""

    compared: int
    position: int | None = None
    """The first differing token, counting from 0; None when all compared tokens are equal."""
    expected: int | None = None
    got: int | None = None

    @property
    def match(self) -> bool:
        return self.position is None


def compare(reference: list[int], disaggregated: list[int]) -> Comparison:
    compared = min(len(reference), len(disaggregated))
    for position in range(compared):
        if reference[position] != disaggregated[position]:
            return Comparison(compared, position, reference[position], disaggregated[position])
    return Comparison(compared)


@dataclass(frozen=True)
class KvMismatch:
    """A canary whose P->D answer differed from prefill's own: kept (the first one) for the proxy's life."""

    at: datetime
    transfer_id: str
    prefill: str
    decode: str
    comparison: Comparison

    def describe(self) -> str:
        c = self.comparison
        return (
            f"decode's tokens after KV transfer {self.transfer_id} differ from prefill's own at token {c.position} "
            f"(counting from 0; expected id {c.expected}, got {c.got}; {c.compared} compared; prefill {self.prefill}, "
            f"decode {self.decode})"
        )

    def to_json(self) -> dict[str, Any]:
        c = self.comparison
        return {
            "at": rfc3339(self.at),
            "transfer_id": self.transfer_id,
            "prefill": self.prefill,
            "decode": self.decode,
            "position": c.position,
            "expected": c.expected,
            "got": c.got,
            "compared": c.compared,
            "message": self.describe(),
        }


def stops_serving(policy: OnKvMismatch, mismatch: KvMismatch | None) -> bool:
    """Whether the proxy refuses client requests (503) and reports not ready: only after a mismatch, and only
    when told to. Reloadable: switching the policy back to ``report`` serves again."""
    return policy == "stopServing" and mismatch is not None
