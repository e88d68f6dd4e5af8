"""A tiny random Llama (2 layers, hidden 128, head_dim 64) and a word-level tokenizer, built locally."""

from __future__ import annotations

import json
import os

VOCAB_WORDS = 500
MARKER = "tiny-llama-v1.json"


def build(path: str, seed: int = 0) -> str:
    """Create (once) a model directory vLLM can serve. Returns ``path``."""
    if os.path.exists(os.path.join(path, MARKER)):
        return path
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
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
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
        json.dump({"seed": seed, "vocab": len(vocab)}, f)
    return path


def prompt(i: int, words: int = 8) -> str:
    return " ".join(f"w{(i * 37 + k * 11) % VOCAB_WORDS}" for k in range(words))
