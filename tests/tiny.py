"""Tiny random causal LMs (llama, gpt2, gemma3, gemma2) for the tests, on the benchmarks' byte-level
tokenizer and initialisation (specdec.benchmark.tiny_llama), so `load_model(str(path))` loads each
through the same path as a real model.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from specdec.benchmark.tiny_llama import (  # noqa: F401 - BOS_ID, EOS_ID: the ids the tests read
    BOS_ID,
    EOS_ID,
    HEADS,
    HIDDEN,
    IDS,
    MAX_POSITIONS,
    TOKENIZER_SIZE,
    llama_config,
    save_random,
    tiny_sizes,
)

KINDS = ("llama", "gpt2", "gemma3", "gemma2")  # the engine tests' matrix
# More families, for the decoder's tests: Llama with Llama 3's rope scaling, Mistral with a window
# shorter than the tests' texts, Qwen 2 (q/k/v biases, windowed upper layers), Qwen 3 (q/k norms),
# Phi-3 (fused projections, longrope over half of each head, a window).
FAMILIES = (*KINDS, "llama3", "mistral", "qwen2", "qwen3", "phi3")
# Phi-3's longrope switches to its long factors past this many positions.
PHI3_ORIGINAL_POSITIONS = MAX_POSITIONS // 2


def make_tiny_model(
    kind: str,
    out_dir: Path,
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    sliding_window: int = 8,
    num_layers: int = 2,
) -> Path:
    """Save a random `kind` model (hidden 64, 4 heads, 256 positions) with the byte tokenizer.

    `vocab_size` defaults to the tokenizer's 259; a larger one pads the output projection the way
    real checkpoints do. For gemma3 and gemma2, layers alternate sliding (window `sliding_window`)
    and full attention, ending with a full one; gemma2 soft-caps its attention and final logits.
    """
    if kind not in FAMILIES:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {FAMILIES}")
    vocab_size = vocab_size or TOKENIZER_SIZE
    if kind == "llama":
        return save_random(llama_config(vocab_size, num_layers), LlamaForCausalLM, out_dir, seed=seed)
    if kind in ("llama3", "mistral", "qwen2", "qwen3", "phi3"):
        return _llama_like(kind, vocab_size, num_layers, sliding_window, out_dir, seed)
    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size, n_embd=HIDDEN, n_layer=num_layers, n_head=HEADS, n_positions=MAX_POSITIONS, **IDS
        )
        return save_random(config, GPT2LMHeadModel, out_dir, seed=seed, add_bos=False)
    layer_types = ["full_attention" if i % 2 else "sliding_attention" for i in range(num_layers)]
    layer_types[-1] = "full_attention"
    gemma = dict(
        tiny_sizes(vocab_size, num_layers),
        head_dim=HIDDEN // HEADS,
        query_pre_attn_scalar=HIDDEN // HEADS,
        sliding_window=sliding_window,
        layer_types=layer_types,
    )
    if kind == "gemma2":
        # Grouped-query, and caps low enough to bind on a random model's logits, so a missing cap shows.
        config = Gemma2Config(num_key_value_heads=2, attn_logit_softcapping=0.1, final_logit_softcapping=5.0, **gemma)
        return save_random(config, Gemma2ForCausalLM, out_dir, seed=seed)
    config = Gemma3TextConfig(num_key_value_heads=1, **gemma)  # multi-query, as in Gemma 3 270M
    return save_random(config, Gemma3ForCausalLM, out_dir, seed=seed)


def _llama_like(kind: str, vocab_size: int, num_layers: int, window: int, out_dir: Path, seed: int) -> Path:
    shared = dict(tiny_sizes(vocab_size, num_layers), num_key_value_heads=HEADS // 2)
    if kind == "llama3":
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        config = llama_config(vocab_size, num_layers)
        config.rope_parameters = {**rope, "original_max_position_embeddings": 16}
        return save_random(config, LlamaForCausalLM, out_dir, seed=seed)
    if kind == "mistral":
        return save_random(MistralConfig(sliding_window=window, **shared), MistralForCausalLM, out_dir, seed=seed)
    if kind == "phi3":
        half = HIDDEN // HEADS // 4  # rotary dims / 2, with half of each head rotated
        rope = dict(
            rope_type="longrope",
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
            short_factor=[1.0 + i / 10 for i in range(half)],
            long_factor=[2.0 + i for i in range(half)],
            original_max_position_embeddings=PHI3_ORIGINAL_POSITIONS,
        )
        # Phi3Config's own original_max_position_embeddings overrides the rope's: both set.
        config = Phi3Config(
            sliding_window=window,
            rope_parameters=rope,
            original_max_position_embeddings=PHI3_ORIGINAL_POSITIONS,
            **shared,
        )
        return save_random(config, Phi3ForCausalLM, out_dir, seed=seed)
    if kind == "qwen2":
        config = Qwen2Config(use_sliding_window=True, sliding_window=window, max_window_layers=1, **shared)
        return save_random(config, Qwen2ForCausalLM, out_dir, seed=seed)
    return save_random(Qwen3Config(head_dim=HIDDEN // HEADS, **shared), Qwen3ForCausalLM, out_dir, seed=seed)


def make_tiny_pair(kind: str, out_dir: Path) -> tuple[Path, Path]:
    """A target (seed 0) and a draft (seed 1) of the same kind, sharing the tokenizer."""
    out_dir = Path(out_dir)
    return make_tiny_model(kind, out_dir / "target", seed=0), make_tiny_model(kind, out_dir / "draft", seed=1)
