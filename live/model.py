"""The live tier's model: a tiny Llama made here, from seeded weights, with a tokenizer trained here.

No hub access: the tokenizer is a byte-level BPE (``tokenizers``) trained on Python's own standard-library
sources, the weights are ``transformers``' LlamaForCausalLM initialised from a fixed seed (a wider
initialiser than the default, so that logits are peaked and greedy choices are not near ties; vLLM's
``--load-format dummy`` gives near-uniform logits, a weak oracle). The directory is cached by a hash of
everything that decides its content (this file, the vocabulary size and the library versions), so it is
built once per cache.

A larger ``vocab`` pads the tokenizer with placeholder tokens ``<|tN|>`` up to that many ids (the trained
BPE stays the same): the goodput probe's prompts are token ids 1000..16999 (pd_runtime.workload.payload),
which vLLM refuses as out of vocabulary unless the tokenizer or the model has that many. The e2e tier's
real-vLLM deployment uses ``PROBE_VOCAB``; ``python -m live.model [--vocab N] CACHE`` builds one and prints
its directory (for a process without this tier's venv, e2e/tests/test_real_vllm.py).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import shutil
import sys
import sysconfig
from pathlib import Path

from pd_runtime.workload.payload import TOKEN_ID_BASE, TOKEN_ID_SPAN

log = logging.getLogger(__name__)

VOCAB = 2048
PROBE_VOCAB = TOKEN_ID_BASE + TOKEN_ID_SPAN  # covers every token id the goodput probe's prompts use
MAX_POSITIONS = 1024
SEED = 20
# A chat template in the Llama family's spirit, short enough to keep prompts small.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]


def _training_text() -> list[str]:
    """A few hundred KB of text that every machine with this Python has: the stdlib's modules, by name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = ["json/decoder.py", "argparse.py", "textwrap.py", "logging/__init__.py", "pathlib.py", "typing.py"]
    return [str(stdlib / n) for n in names if (stdlib / n).is_file()]


def content_key(vocab: int = VOCAB) -> str:
    import tokenizers
    import torch
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    versions = (sys.version, tokenizers.__version__, transformers.__version__, torch.__version__)
    h.update(repr((versions, vocab)).encode())
    for path in _training_text():
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def _build(out: Path, vocab: int) -> None:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train(_training_text(), vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIAL)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.add_tokens([f"<|t{i}|>" for i in range(len(tokenizer), vocab)])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=max(vocab, len(tokenizer)),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def tiny_llama(cache: Path, vocab: int = VOCAB) -> Path:
    """The model directory (config, safetensors, tokenizer), built on first use under ``cache``."""
    out = cache / f"tiny-llama-{content_key(vocab)}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".tiny-llama.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".complete").exists():
            log.info("building the tiny Llama into %s", out)
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            _build(tmp, vocab)
            (tmp / ".complete").touch()
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m live.model", description="Build the tiny Llama; print its path.")
    parser.add_argument("cache", type=Path, help="the models cache directory")
    parser.add_argument("--vocab", type=int, default=VOCAB, help=f"token ids it knows (default {VOCAB})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.stdout.write(f"{tiny_llama(args.cache, args.vocab)}\n")


if __name__ == "__main__":
    main()
