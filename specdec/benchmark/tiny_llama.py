"""A tiny random llama (hidden 64, 2 layers) with a byte-level tokenizer: a model whose compute is
near nothing, so the benchmarks (draft_rpc, verify_pool) measure the RPC and verification around
it. The tests' tiny models (tests/tiny.py) add other families on the same tokenizer and
initialisation.

Saved with `save_pretrained`, so `load_model(str(path))` loads it through the same path as a
real model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")  # ids 256, 257, 258: bytes keep ids 0..255
PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
TOKENIZER_SIZE = 259

HIDDEN = 64
HEADS = 4
MAX_POSITIONS = 256
# std of the logits of a fresh model. At the default init (0.02) logits spread by ~0.16, so the
# top two are often closer than the ~1e-6 noise that batching or a different kernel adds in fp32,
# and greedy argmax would flip between batched and unbatched runs. A spread of several units
# makes the argmax well separated (and the distributions peaky, like a trained model's).
LOGIT_STD = 4.0
# Untied output projection: _make_peaky scales it alone. Scaling a tied matrix inflates the
# input embeddings too, and the gpt2/gemma3 models then repeat one token forever (measured).
IDS = dict(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, tie_word_embeddings=False)


def make_tiny_llama(out_dir: Path, *, seed: int = 0, vocab_size: int | None = None, num_layers: int = 2) -> Path:
    """Save a random llama (hidden 64, 4 heads, grouped-query, 256 positions) with the byte tokenizer."""
    return save_random(llama_config(vocab_size or TOKENIZER_SIZE, num_layers), LlamaForCausalLM, out_dir, seed=seed)


def llama_config(vocab_size: int, num_layers: int) -> LlamaConfig:
    # grouped-query attention, as in real Llamas
    return LlamaConfig(**tiny_sizes(vocab_size, num_layers), num_key_value_heads=HEADS // 2)


def tiny_sizes(vocab_size: int, num_layers: int) -> dict:
    """The config fields every tiny decoder-only family shares (hidden 64, 4 heads, 256 positions)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=num_layers,
        num_attention_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        **IDS,
    )


def save_random(
    config: PretrainedConfig, model_class: type[PreTrainedModel], out_dir: Path, *, seed: int, add_bos: bool = True
) -> Path:
    """Initialise `model_class(config)` from `seed` with peaky logits and save it with the byte
    tokenizer (`add_bos`: Llama and Gemma tokenizers prepend <bos>, GPT-2's does not)."""
    if config.vocab_size < TOKENIZER_SIZE:
        raise ValueError(f"vocab_size {config.vocab_size} is smaller than the tokenizer ({TOKENIZER_SIZE})")
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = model_class(config).eval()
        _make_peaky(model)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    make_tokenizer(add_bos=add_bos).save_pretrained(out_dir)
    return out_dir


def make_tokenizer(*, add_bos: bool) -> PreTrainedTokenizerFast:
    """Byte-level BPE with no merges: one token per byte, so any UTF-8 text round-trips."""
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", BOS_ID)]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


@torch.no_grad()
def _make_peaky(model: PreTrainedModel) -> None:
    """Scale the output projection so the logits spread by about LOGIT_STD (see its comment).

    The final norm leaves hidden states with roughly unit scale per dimension, so a weight std of
    LOGIT_STD / sqrt(hidden) gives logits of std about LOGIT_STD.
    """
    model.get_output_embeddings().weight.normal_(0.0, LOGIT_STD / HIDDEN**0.5)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of the ByteLevel pre-tokenizer."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
