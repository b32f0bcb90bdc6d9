"""A migrated stream's text across the splice, with vLLM's own detokenizer (docs/proxy.md, "Migration").

vLLM turns a request's token ids into streamed text with ``IncrementalDetokenizer`` (``vllm.v1.engine``),
primed with the prompt's ids. A continuation's prompt is the original prompt plus the tokens already
streamed, so a break inside a character (its bytes split across byte-level tokens) primes it with ids whose
text ends in U+FFFD; then vLLM's first text is the prompt's and the streamed text again before the new
(tokenizers' ``DecodeStream`` keeps no prefix). The proxy's splice must give the client the text of the
same request undisturbed. Here the events are made by vLLM's detokenizer and a byte-level BPE tokenizer
trained in the test (the live tier's kind of tokenizer; no hub access).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import vllm
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast
from vllm import SamplingParams
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

from pd_runtime.proxy import migration
from pd_runtime.proxy.legs import ClientRequest

PROMPT = "def format_usage(self):\n    "
ANSWER = "return 'caf\u00e9 \u00fcber \u4e2d\u6587 ok'"
"""Characters of two and three UTF-8 bytes that the tokenizer has no merges for: each spans byte tokens."""
TRAINING = ["def format_usage(self):\n    return self.usage\n", "return 'ok'\n"] * 50


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TRAINING, vocab_size=400, min_frequency=2, special_tokens=["<s>", "</s>"])
    out: Path = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(out)
    return get_tokenizer(str(out))


def events(tokenizer: Any, prompt_ids: list[int], generated: list[int]) -> list[bytes]:
    """A streamed completion's events as vLLM's detokenizer gives their text: one token a step."""
    params = SamplingParams(max_tokens=len(generated), temperature=0.0)
    request = EngineCoreRequest("r", prompt_ids, None, params, None, 0.0, None, None, None)
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    out = []
    for step, token in enumerate(generated):
        detokenizer.update([token], False)
        choice = {
            "index": 0,
            "text": detokenizer.get_next_output_text(False, True),
            "logprobs": None,
            "finish_reason": None,
            "token_ids": [token],
            "prompt_token_ids": None if step else prompt_ids,
        }
        chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
        out.append(b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode())
    return out


def text_of(stream: bytes) -> str:
    chunks = [json.loads(event[6:]) for event in stream.split(b"\n\n") if event.startswith(b"data: {")]
    return "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])


def test_a_break_inside_a_character_splices_the_undisturbed_text(tokenizer: Any) -> None:
    prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    generated = tokenizer.encode(ANSWER, add_special_tokens=False)
    undisturbed = events(tokenizer, prompt_ids, generated)
    assert text_of(b"\n\n".join(undisturbed)) == ANSWER
    inside = [k for k in range(1, len(generated)) if tokenizer.decode(prompt_ids + generated[:k]).endswith("\ufffd")]
    assert inside, "the answer has no break inside a character: the test would prove nothing"
    for break_at in [*inside, inside[0] - 1]:  # and one break between characters
        client = ClientRequest("completions", {"prompt": PROMPT, "stream": True, "max_tokens": len(generated)})
        tokens = migration.StreamTokens(client)
        before = tokens.feed(b"\n\n".join(undisturbed[:break_at]) + b"\n\n")
        continued = migration.continuation(client, tokens)
        assert continued.body["prompt"] == prompt_ids + generated[:break_at]
        rest = events(tokenizer, continued.body["prompt"], generated[break_at:])
        if break_at in inside:  # vLLM repeats the prompt's and the streamed text in its first text
            assert text_of(b"\n\n".join(rest)).startswith(PROMPT)
        after = migration.Splice(tokens, migration.offsets_by_tokens(vllm.__version__)).feed(
            b"\n\n".join(rest) + b"\n\n"
        )
        assert text_of(before + after) == ANSWER, f"break after {break_at} tokens"
        assert tokens.token_ids == generated


def test_the_splice_counts_text_offsets_as_this_release_does() -> None:
    """Where a stream's next chunk's logprob ``text_offset`` begins, read in this release's completions
    stream: 0.31 adds each chunk's text (held-back text not yet counted), 0.32 on the reported tokens'
    strings; the splice shifts a continuation's offsets by the same rule (``migration.offsets_by_tokens``)."""
    source = inspect.getsource(OpenAIServingCompletion.completion_stream_generator)
    by_text = "previous_text_lens[i] += len(delta_text)" in source
    by_tokens = "next_text_offsets[i] = logprobs.text_offset[-1] + len(" in source
    assert by_text != by_tokens, "the release counts offsets some third way: read its completion_stream_generator"
    assert migration.offsets_by_tokens(vllm.__version__) is by_tokens
