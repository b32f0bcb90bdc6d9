"""Selective disaggregation: the pure decision, the token estimate, the decode engines' prefix caches as
the proxy tracks them, and a proxy serving short prompts on decode alone (docs/proxy.md, "Selective
disaggregation")."""

from __future__ import annotations

import pytest

from pd_runtime.proxy.disaggregation import DecodeCaches, Prompt, decide, prompt_of, text_tokens
from tests.proxy.conftest import PdSetup, SetupFactory
from tests.proxy.proxy_fakes import wait_for


def _ids(count: int, start: int = 1000) -> list[int]:
    return list(range(start, start + count))


# ---- the decision ----------------------------------------------------------------------------


def test_always_disaggregates_whatever_the_prompt() -> None:
    assert decide("always", 256, Prompt(3, ())) == "disaggregated"


@pytest.mark.parametrize(
    ("tokens", "cached", "reason"),
    [
        (255, 0, "short_prompt"),
        (256, 0, "disaggregated"),  # the threshold itself is not below it
        (5000, 4745, "cached_prefix"),  # 255 tokens left to compute
        (5000, 4744, "disaggregated"),
    ],
)
def test_threshold_serves_short_prompts_and_short_uncached_parts_on_decode(
    tokens: int, cached: int, reason: str
) -> None:
    assert decide("threshold", 256, Prompt(tokens, ()), cached) == reason


def test_a_request_without_one_prompt_is_disaggregated() -> None:
    assert prompt_of({"prompt": ["a batch", "of two"]}) is None
    assert decide("threshold", 256, None) == "disaggregated"


# ---- counting tokens without a tokenizer ------------------------------------------------------


def test_a_token_id_prompt_counts_exactly() -> None:
    prompt = prompt_of({"prompt": _ids(40)})
    assert prompt is not None and prompt.tokens == 40 and len(prompt.blocks) == 2  # two full 16-id blocks
    assert prompt_of({"prompt": [_ids(40)]}) == prompt


def test_text_counts_four_ascii_characters_or_one_other_character_a_token() -> None:
    assert text_tokens("abcd" * 10) == 10
    assert text_tokens("abcde") == 2
    assert text_tokens("日本語のテキスト") == 8  # CJK: about a character a token, never fewer counted
    assert text_tokens("naïve") == 2  # 4 ASCII characters and one other


def test_chat_messages_count_their_roles_and_contents() -> None:
    body = {"messages": [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 400}]}
    prompt = prompt_of(body)
    assert prompt is not None and 200 <= prompt.tokens <= 210


# ---- what decode has cached --------------------------------------------------------------------


def test_a_prompt_sent_to_a_decode_engine_is_cached_there_only() -> None:
    caches = DecodeCaches(capacity_tokens=1 << 20)
    long = prompt_of({"prompt": _ids(1000)})
    assert long is not None and caches.cached_tokens("d1", long) == 0
    caches.sent("d1", long)
    assert caches.cached_tokens("d1", long) == 992  # 62 full blocks; the last 8 ids are no full block
    assert caches.cached_tokens("d2", long) == 0
    longer = prompt_of({"prompt": _ids(1200)})  # the same beginning
    assert longer is not None and caches.cached_tokens("d1", longer) == 992


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    caches = DecodeCaches(capacity_tokens=1 << 20)
    prompt = prompt_of({"prompt": _ids(64)})
    assert prompt is not None
    caches.sent("d1", prompt)
    assert caches.cached_tokens("d1", prompt) == 63


def test_the_least_recently_sent_prompt_leaves_a_full_cache_first() -> None:
    caches = DecodeCaches(capacity_tokens=2 * 320)  # room for two 320-token prompts
    first, second, third = (prompt_of({"prompt": _ids(320, start)}) for start in (1000, 5000, 9000))
    assert first is not None and second is not None and third is not None
    for prompt in (first, second, third):
        caches.sent("d1", prompt)
    assert caches.cached_tokens("d1", first) == 0
    assert caches.cached_tokens("d1", third) == 319


def test_without_a_cache_size_nothing_counts_as_cached() -> None:
    caches = DecodeCaches(capacity_tokens=0)
    prompt = prompt_of({"prompt": _ids(1000)})
    assert prompt is not None
    caches.sent("d1", prompt)
    assert caches.cached_tokens("d1", prompt) == 0


# ---- a proxy with fake engines -------------------------------------------------------------------


async def _reasons(setup: PdSetup) -> dict[str, float]:
    async with setup.client.get(setup.admin_url + "/metrics") as resp:
        text = await resp.text()
    prefix = 'pd_proxy_disaggregation_total{reason="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


@pytest.mark.parametrize("mode", ["WRITE", "READ"])
async def test_a_short_prompt_goes_to_decode_alone_and_a_long_one_is_disaggregated(
    pd_setup: SetupFactory, mode: str
) -> None:
    setup = await pd_setup(mode=mode, disaggregation="threshold", disaggregation_threshold=32)
    short = {"model": "m", "prompt": _ids(20), "max_tokens": 5}
    status, text = await setup.stream(short)
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    assert setup.prefill.requests == []
    (alone,) = setup.decode.requests
    assert "kv_transfer_params" not in alone.body and alone.body["prompt"] == short["prompt"]
    status, _ = await setup.post("/v1/completions", {**short, "prompt": _ids(40, 5000)})
    assert status == 200
    # the fake decode answers without waiting for the KV: its answer may be relayed before prefill's leg,
    # which the proxy then finishes in the background, reaches the fake prefill
    await wait_for(lambda: len(setup.prefill.requests) == 1, what="prefill's leg")
    assert len(setup.decode.requests) == 2
    assert setup.decode.requests[1].body["kv_transfer_params"]["do_remote_prefill"] is True
    assert await _reasons(setup) == {"disaggregated": 1, "short_prompt": 1, "cached_prefix": 0}


async def test_a_prompt_decode_has_mostly_cached_goes_to_decode_alone(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(disaggregation="threshold", disaggregation_threshold=32)
    first = {"model": "m", "prompt": _ids(200), "max_tokens": 5}
    follow_up = {**first, "prompt": _ids(220)}  # the first one's 192 cached tokens, 28 new ones
    unrelated = {**first, "prompt": _ids(220, 9000)}
    for body in (first, follow_up, unrelated):
        status, _ = await setup.post("/v1/completions", body)
        assert status == 200
    assert [len(r.body["prompt"]) for r in setup.prefill.requests] == [200, 220]
    assert "kv_transfer_params" not in setup.decode.requests[1].body
    assert await _reasons(setup) == {"disaggregated": 2, "short_prompt": 0, "cached_prefix": 1}


async def test_always_disaggregates_a_short_prompt(pd_setup: SetupFactory) -> None:
    setup = await pd_setup()
    status, _ = await setup.post("/v1/completions", {"model": "m", "prompt": _ids(3), "max_tokens": 5})
    assert status == 200 and len(setup.prefill.requests) == 1
    assert await _reasons(setup) == {"disaggregated": 1, "short_prompt": 0, "cached_prefix": 0}
