"""prefix_affinity: the prompt's prefix key, the consistent-hash ring, the fallback to load, and a real
proxy sending prompts that share a beginning to one prefill engine."""

from __future__ import annotations

from collections import Counter

from pd_runtime.proxy.affinity import CHARS_PER_TOKEN, owner, prefix_key
from pd_runtime.proxy.load import EngineLoad
from pd_runtime.proxy.routing import KV_USAGE_HIGH, Candidate, Router, Slot, least_load, prefix_affinity
from tests.proxy.conftest import SetupFactory, second_instance

KEYS = [f"system prompt {i}".encode() for i in range(2000)]


def _owners(members: list[str]) -> dict[bytes, str]:
    return {key: owner(members, key) for key in KEYS}


# ---- the key ------------------------------------------------------------------------------------


def test_token_id_prompts_key_on_their_first_tokens() -> None:
    shared = list(range(100, 164))
    assert prefix_key({"prompt": [*shared, 1, 2]}, 64) == prefix_key({"prompt": [*shared, 9]}, 64)
    assert prefix_key({"prompt": [[*shared, 1]]}, 64) == prefix_key({"prompt": shared}, 64)  # one-element batch
    assert prefix_key({"prompt": [7, *shared]}, 64) != prefix_key({"prompt": shared}, 64)


def test_text_prompts_key_on_four_characters_per_token() -> None:
    head = "x" * (CHARS_PER_TOKEN * 16)
    assert prefix_key({"prompt": head + "first question"}, 16) == prefix_key({"prompt": head + "another"}, 16)
    assert prefix_key({"prompt": head[:-1] + "y"}, 16) != prefix_key({"prompt": head}, 16)
    assert prefix_key({"prompt": "12 34"}, 16) != prefix_key({"prompt": [12, 34]}, 16)  # text is not ids


def test_chat_messages_key_on_roles_and_contents_in_order() -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}

    def chat(*messages: dict[str, object]) -> bytes | None:
        return prefix_key({"messages": list(messages)}, 32)

    assert chat(system, {"role": "user", "content": "a"}) == chat(system, {"role": "user", "content": "b"})
    parts = {"role": "system", "content": [{"type": "text", "text": system["content"]}]}
    assert chat(parts, {"role": "user", "content": "a"}) == chat(system, {"role": "user", "content": "c"})
    assert chat({"role": "user", "content": "hi"}) != chat({"role": "system", "content": "hi"})
    assert prefix_key({"model": "m"}, 32) is None


# ---- the ring -----------------------------------------------------------------------------------


def test_every_member_gets_a_fair_share_of_keys() -> None:
    members = ["10.0.0.1:20005", "10.0.0.2:20005", "10.0.0.3:20005", "10.0.0.4:20005"]
    shares = Counter(_owners(members).values())
    assert set(shares) == set(members)
    assert all(0.15 < n / len(KEYS) < 0.35 for n in shares.values()), shares


def test_a_joining_instance_takes_about_one_kth_of_the_keys_all_from_the_others() -> None:
    members = [f"10.0.0.{i}:20005" for i in range(1, 5)]
    before, after = _owners(members), _owners([*members, "10.0.0.5:20005"])
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == "10.0.0.5:20005" for key in moved)  # keys move only to the new instance
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5


def test_a_leaving_instance_hands_on_only_its_own_keys() -> None:
    members = [f"10.0.0.{i}:20005" for i in range(1, 6)]
    before, after = _owners(members), _owners(members[:-1])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "10.0.0.5:20005"}
    assert owner(reversed(members), KEYS[0]) == before[KEYS[0]]  # the order of the members does not matter


# ---- the choice ---------------------------------------------------------------------------------

A, B, C = ("a:1", None), ("b:1", None), ("c:1", None)


def _key_homed_at(slot: Slot, slots: list[Slot]) -> bytes:
    return next(key for key in KEYS if owner((s[0] for s in slots), key) == slot[0])


def test_the_prefix_goes_home_while_its_engine_is_not_saturated() -> None:
    slots = [A, B, C]
    key = _key_homed_at(B, slots)
    assert all(prefix_affinity(slots, {}, {}, counter, key) == B for counter in range(6))
    assert prefix_affinity(slots, {B: 4}, {}, 0, key) == B  # 4 more than the least loaded: still home
    loads = {B: EngineLoad(running=1, waiting=3)}
    assert prefix_affinity(slots, {}, loads, 0, key) == B  # the engine's own queue counts the same way


def test_a_saturated_home_falls_back_to_the_least_loaded_slot() -> None:
    slots = [A, B, C]
    key = _key_homed_at(B, slots)
    assert prefix_affinity(slots, {B: 5, C: 1}, {}, 0, key) == A  # 5 more than A's 0: least_load's choice
    assert prefix_affinity(slots, {B: 5}, {}, 0, key, max_imbalance=8) == B
    full = {B: EngineLoad(kv_usage=KV_USAGE_HIGH)}
    assert prefix_affinity(slots, {}, full, 0, key) == least_load(slots, {}, full, 0) != B
    everyone_full = {s: EngineLoad(kv_usage=0.95) for s in slots}
    assert prefix_affinity(slots, {}, everyone_full, 0, key) == B  # no better place: stay home
    assert prefix_affinity(slots, {A: 2}, {}, 0, None) == least_load(slots, {A: 2}, {}, 0)  # no key: load


def test_the_home_instance_gets_its_least_loaded_dp_rank_and_decode_goes_by_load() -> None:
    router = Router("prefix_affinity")
    candidates = [Candidate("a:1", 2), Candidate("b:1", 2)]
    key = next(key for key in KEYS if owner(["a:1", "b:1"], key) == "b:1")
    router.acquire(("b:1", 0))
    assert router.pick("P", candidates, key=key) == ("b:1", 1)
    router.acquire(("a:1", 0))
    router.acquire(("a:1", 1))
    picks = {router.pick("D", candidates, key=key) for _ in range(4)}
    assert picks == {("b:1", 1)}  # decode: the least loaded slot, whatever the prompt


# ---- a real proxy -------------------------------------------------------------------------------


async def test_prompts_sharing_a_beginning_reach_one_prefill_engine(pd_setup: SetupFactory) -> None:
    setup = await pd_setup(mode="READ", policy="prefix_affinity", affinity_prefix_tokens=8)
    other = await second_instance(setup, "P")
    prompts = [[g * 1000 + t for t in range(8)] + [i] for g in range(16) for i in range(2)]
    for prompt in prompts:  # one at a time: no engine is ever saturated (that is the core's test)
        assert (await setup.post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2}))[0] == 200
    homes: dict[int, set[int]] = {}
    for index, engine in enumerate((setup.prefill, other)):
        for record in engine.requests:
            homes.setdefault(record.body["prompt"][0] // 1000, set()).add(index)
    assert len(homes) == 16 and all(len(engines) == 1 for engines in homes.values()), homes  # one engine each
    assert {e for engines in homes.values() for e in engines} == {0, 1}  # both used (all 16 on one: p = 3e-5)
