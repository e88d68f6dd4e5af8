"""A small random Llama and a word-level tokenizer, built locally (no downloads).

The default is the tests' and the demo's tiny model (2 layers, hidden 128, head_dim 64: a decode step of a few
milliseconds). The benchmarks also build a larger one (``STEP_SIZED``) whose decode steps at batch 64 take tens of
milliseconds on one core, as an accelerator's do on a real model."""

from __future__ import annotations

import json
import os
from types import MappingProxyType

VOCAB_WORDS = 500
MARKER = "tiny-llama-v1.json"

#: The tests' tiny model.
TINY = MappingProxyType({"hidden": 128, "layers": 2, "intermediate": 256})
#: The step-time-realistic model of ``benchmarks/e2e_overhead.py --model step`` (docs/performance.md records the
#: decode step time it gave at batch 64 on the CI machine's kind).
STEP_SIZED = MappingProxyType({"hidden": 512, "layers": 2, "intermediate": 1536})


def build(path: str, seed: int = 0, hidden: int = 128, layers: int = 2, intermediate: int = 256) -> str:
    """Create (once per size) a model directory vLLM can serve, head_dim 64. Returns ``path``."""
    size = {"seed": seed, "hidden": hidden, "layers": layers, "intermediate": intermediate}
    try:
        with open(os.path.join(path, MARKER)) as f:
            built = json.load(f)
        if all(built.get(k, TINY.get(k, 0)) == v for k, v in size.items()):
            return path
    except (OSError, ValueError):
        pass
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(path, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(path)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump({**size, "vocab": len(vocab)}, f)
    return path


def prompt(i: int, words: int = 8) -> str:
    return " ".join(f"w{(i * 37 + k * 11) % VOCAB_WORDS}" for k in range(words))
