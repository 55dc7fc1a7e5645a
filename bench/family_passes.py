"""The paged decoder against transformers' modules, family by family, at the embedded model's shapes.

Each family's random model (transformers' own config class, Gemma 3 270M's shapes: 18 layers,
d 640, MLP 2,048, 4 query heads and 1 KV head of 256, a 262,144-token vocabulary) runs in the
actor's verifier, in this process: R sessions prefilled with --context random tokens, then greedy
decode passes of one token a row, timed (the median of --passes) with the fused decoder and with
transformers' modules (`SPECDEC_PAGED_DECODER=0`'s path), one after the other on the same model,
pool and rows. Random weights serve speed; exactness is the tests' (tests/engine/test_paged_decoder.py).

  python -m specdec.bench.family_passes [--rows 1,16,64] [--families gemma3,llama,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
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

from specdec.benchmark import flags
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.runtime import paged_decoder as decoders
from specdec.runtime.models import LoadedModel
from specdec.runtime.projection import pack_weights, use_column_kernels
from specdec.target_service.verifier import TargetVerifier, VerifyItem

SHAPES = dict(
    vocab_size=262_144,
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    max_position_embeddings=32_768,
)
_LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0)


def _gemma3(shapes: dict) -> Gemma3TextConfig:
    layers = shapes["num_hidden_layers"]
    layer_types = [
        "full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)
    ]
    return Gemma3TextConfig(**shapes, query_pre_attn_scalar=256, sliding_window=512, layer_types=layer_types)


def _gemma2(shapes: dict) -> Gemma2Config:
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(shapes["num_hidden_layers"])]
    caps = dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)  # Gemma 2's own
    return Gemma2Config(**shapes, query_pre_attn_scalar=256, sliding_window=512, layer_types=layer_types, **caps)


def _phi3(shapes: dict) -> Phi3Config:
    """Phi-3.5's longrope (factors past 4,096 positions) and window. Phi-3's heads are d / heads
    wide (160 here: its config has no head_dim)."""
    shapes = {name: value for name, value in shapes.items() if name != "head_dim"}
    half = shapes["hidden_size"] // shapes["num_attention_heads"] // 2
    rope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * half, long_factor=[4.0] * half)
    rope["original_max_position_embeddings"] = 4096
    window = dict(original_max_position_embeddings=4096, sliding_window=2047)
    return Phi3Config(**shapes, rope_parameters=rope, pad_token_id=0, bos_token_id=2, eos_token_id=1, **window)


def _llama3(shapes: dict) -> LlamaConfig:
    config = LlamaConfig(**shapes)
    config.rope_parameters = {**_LLAMA3, "original_max_position_embeddings": 8192}
    return config


FAMILIES = {
    "gemma3": (_gemma3, Gemma3ForCausalLM),
    "gemma2": (_gemma2, Gemma2ForCausalLM),
    "llama": (lambda shapes: LlamaConfig(**shapes), LlamaForCausalLM),
    "llama3": (_llama3, LlamaForCausalLM),
    "mistral": (lambda shapes: MistralConfig(**shapes, sliding_window=512), MistralForCausalLM),
    "qwen2": (lambda shapes: Qwen2Config(**shapes), Qwen2ForCausalLM),
    "qwen3": (lambda shapes: Qwen3Config(**shapes), Qwen3ForCausalLM),
    "phi3": (_phi3, Phi3ForCausalLM),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.family_passes", description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma separated (default {','.join(FAMILIES)})")
    p.add_argument("--rows", default="1,16,64", help="rows a pass, comma separated (default 1,16,64)")
    p.add_argument("--context", type=int, default=64, help="prompt tokens a session (default 64)")
    p.add_argument("--passes", type=int, default=6, help="timed passes per arm and row count (default 6)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--layers", type=int, default=18, help="decoder layers (default 18, as Gemma 3 270M)")
    p.add_argument("--vocab", type=int, default=262_144, help="vocabulary (default 262,144, as Gemma 3 270M)")
    p.add_argument(
        "--versus-gemma3", action="store_true", help="time each family's fused pass against Gemma 3's, in turns"
    )
    p.add_argument("--rounds", type=int, default=5, help="with --versus-gemma3: turns per cell (default 5)")
    flags.add_json(p)
    return p.parse_args(argv)


def build(family: str, shapes: dict, pack: bool = True) -> LoadedModel:
    """A random model of `family` at `shapes` (`SHAPES`: the embedded model's), prepared as loading
    prepares one for a CPU (`pack`: oneDNN's packed weight copies; none for another device)."""
    make_config, model_class = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(make_config(shapes)).eval().requires_grad_(False)
    if pack:
        pack_weights(use_column_kernels(model))
    return LoadedModel(model, None, family, frozenset(), shapes["vocab_size"], shapes["max_position_embeddings"])


def time_passes(verifier, rows: int, context: int, passes: int, tag: str) -> float:
    """Median ms of a greedy decode pass over `rows` sessions of `context` prompt tokens."""
    generator = torch.Generator().manual_seed(rows)
    vocab = min(30_000, verifier.loaded.vocab_size)
    sessions = {f"{tag}-{i}": torch.randint(3, vocab, (context,), generator=generator).tolist() for i in range(rows)}
    greedy = SamplingParams()

    def step() -> None:
        items = [VerifyItem(s, t, DraftProposal([]), greedy) for s, t in sessions.items()]
        for tokens, result in zip(sessions.values(), verifier.verify_batch(items)):
            tokens.extend(result.accepted_ids)

    step()  # the prefill
    seconds = []
    for _ in range(passes + 1):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    for session_id in sessions:
        verifier.end_session(session_id)
    return 1000 * statistics.median(seconds[1:])


def versus_gemma3(args, shapes: dict, rows: list[int]) -> list[dict]:
    """Each family's fused pass against Gemma 3's at the same shapes: both models loaded side by
    side and their passes timed in turns (`--rounds` medians of `--passes`), so the machine's drift
    falls on both alike; the ratio is the median of the per-turn ratios."""
    gemma = TargetVerifier(build("gemma3", shapes), kv_cache_bytes=1 << 30)
    results = []
    for family in [f for f in args.families.split(",") if f != "gemma3"]:
        other = TargetVerifier(build(family, shapes), kv_cache_bytes=1 << 30)
        for r in rows:
            turns = []
            for i in range(args.rounds):
                base = time_passes(gemma, r, args.context, args.passes, f"gemma3-{family}-{i}")
                turns.append(time_passes(other, r, args.context, args.passes, f"{family}-{i}") / base)
            ratio = statistics.median(turns)
            results.append({"family": family, "rows": r, "fused_over_gemma3": ratio, "turns": turns})
            print(
                f"{family:8} {r:3} rows: fused pass / Gemma 3's {ratio:.2f} (turns {min(turns):.2f}-{max(turns):.2f})"
            )
        del other
        gc.collect()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = dict(SHAPES, num_hidden_layers=args.layers, vocab_size=args.vocab)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    if args.versus_gemma3:
        _write(args, versus_gemma3(args, shapes, rows))
        return 0
    results = []
    for family in args.families.split(","):
        loaded = build(family, shapes)
        verifier = TargetVerifier(loaded, kv_cache_bytes=1 << 30)
        fused = decoders.paged_decoder(loaded.model)
        if fused is None:
            raise SystemExit(f"the paged decoder does not serve {family}")
        for r in rows:
            times = {}
            for arm, decoder in (("fused", fused), ("transformers", None)):
                loaded.model.__dict__[decoders._ATTR] = decoder
                times[arm] = time_passes(verifier, r, args.context, args.passes, f"{family}-{arm}")
            results.append({"family": family, "rows": r, **{f"{k}_ms": v for k, v in times.items()}})
            print(
                f"{family:8} {r:3} rows: fused {times['fused']:6.1f} ms, transformers {times['transformers']:6.1f} ms,"
                f" fused / transformers {times['fused'] / times['transformers']:.2f}",
                flush=True,
            )
        del verifier, loaded, fused
        gc.collect()
    gemma = {r["rows"]: r["fused_ms"] for r in results if r["family"] == "gemma3"}
    for r in results:
        r["fused_over_modules"] = r["fused_ms"] / r["transformers_ms"]
        if r["rows"] in gemma:
            r["fused_over_gemma3"] = r["fused_ms"] / gemma[r["rows"]]
    _write(args, results)
    return 0


def _write(args, results: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rows": results}, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
