"""The target engine on one device: exactness first, then verify latency against k and decode
throughput against concurrency.

  python -m specdec.bench.gpu_engine [--device cuda] [--model SPEC | --family KIND] [--dtype bf16|fp32]
      [--compile inductor|cudagraphs] [--json PATH]

Run by bench/gpu_check.sh on a GPU (it runs on a CPU too, which is how the suite keeps it
working). For the model (default: the embedded Gemma 3 270M; with --family, a random model of that family
at its shapes, `family_passes`, with its tokenizer):

1. exactness: greedy speculative decoding with the n-gram drafter equals target-only greedy
   decoding for k = 1..8 (and how far target-only agrees with transformers' own `generate`,
   another code path), and a batched verify of sessions of different lengths equals the same
   rounds one at a time. In fp32 both must hold exactly. In bf16 a batch's composition changes
   its numerics (other rows change the GEMM tiling and the reduction order), so two runs of one
   request may part where the target's top two logits tie within bf16's rounding; the check
   reports how many tokens agree before the first difference instead of failing.
2. verify latency: one session holding --context tokens verifies rounds of k = 0..8 drafts;
   median milliseconds a pass.
3. throughput: N sessions of --context tokens decode one token each per pass (k = 0), N = 1, 4,
   16, 64, 128 (the sessions' KV must fit --kv-cache-bytes); tokens/s = N / median pass time.

With --compile MODE the exactness checks run on the compiled engine (`specdec.runtime.compiled`),
and every latency and throughput cell is timed on an eager and a compiled verifier side by side,
pass for pass in turn (the same rounds, each verifier's own KV pool), with their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace

import torch

from specdec.bench import family_passes
from specdec.benchmark import flags
from specdec.coordinator.engine import EngineConfig, GenerationRequest
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.local.in_process import build_engine
from specdec.runtime.compiled import COMPILE_MODES
from specdec.runtime.loading import load_model, load_tokenizer
from specdec.runtime.models import LoadedModel
from specdec.target_service.verifier import TargetVerifier, VerifyItem

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROMPT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def fibonacci_memo(n, memo={}):\n"
)


def random_family(kind: str, layers: int, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """A random `kind` model at the embedded model's shapes (`layers` of them), with its tokenizer:
    random weights serve the exactness checks as well as trained ones."""
    loaded = family_passes.build(kind, dict(family_passes.SHAPES, num_hidden_layers=layers), pack=device.type == "cpu")
    loaded.model.to(device=device, dtype=dtype)
    return replace(loaded, tokenizer=load_tokenizer(None), name=f"random {kind}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def exactness(loaded, args) -> dict:
    prompt = loaded.tokenizer(PROMPT)["input_ids"]
    target = loaded
    engine = build_engine(target, None, EngineConfig(max_draft_tokens=8, adaptive=False), compile_mode=args.compile)

    def generate(k: int) -> list[int]:
        request = GenerationRequest(prompt_token_ids=prompt, max_new_tokens=args.new_tokens, max_draft_tokens=k)
        return asyncio.run(engine.generate(request)).token_ids

    plain = generate(0)
    by_k = {k: _agree(generate(k), plain) for k in range(1, 9)}
    # transformers' own greedy generate (SDPA and its DynamicCache: another code path).
    ids = torch.tensor([prompt], device=next(loaded.model.parameters()).device)
    hf = loaded.model.generate(
        ids, max_new_tokens=len(plain), min_new_tokens=len(plain), do_sample=False, eos_token_id=None
    )
    hf_agrees = _agree(hf[0, len(prompt) :].tolist(), plain)
    # Batched next to one at a time: sessions of 8 different lengths, k from 0 to 7.
    g = torch.Generator().manual_seed(0)
    vocab = loaded.vocab_size
    items = [
        VerifyItem(
            f"s{i}",
            torch.randint(3, vocab, (16 + 37 * i,), generator=g).tolist(),
            DraftProposal(torch.randint(3, vocab, (i,), generator=g).tolist()),
            SamplingParams(),
        )
        for i in range(8)
    ]
    budget = 1 << 28
    together = TargetVerifier(loaded, kv_cache_bytes=budget, compile_mode=args.compile).verify_batch(items)
    alone_verifier = TargetVerifier(loaded, kv_cache_bytes=budget, compile_mode=args.compile)
    alone = [alone_verifier.verify(it.session_id, it.tokens, it.proposal, it.sampling) for it in items]
    return {
        "new_tokens": len(plain),
        "speculative_agrees_with_target_only": by_k,
        "speculative_equal": all(n == len(plain) for n in by_k.values()),
        "hf_generate_agrees": hf_agrees,
        "batched_equal": together == alone,
    }


def _time_passes(verifiers: dict[str, TargetVerifier], items: list[VerifyItem], repeats: int, device) -> dict:
    """Median seconds of one pass over `items` for each verifier, timed in turn pass for pass
    (the same rounds again: every draft rejected at x_1 or none given, so sessions never grow)."""
    for verifier in verifiers.values():
        verifier.verify_batch(items)  # prefill
    times: dict[str, list[float]] = {name: [] for name in verifiers}
    for _ in range(repeats):
        for name, verifier in verifiers.items():
            _sync(device)
            started = time.perf_counter()
            verifier.verify_batch(items)
            _sync(device)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def latency_and_throughput(loaded, args, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(1)
    vocab = loaded.vocab_size
    pass_tokens = max(args.context + 16, 256)
    verifiers = {"eager": TargetVerifier(loaded, kv_cache_bytes=args.kv_cache_bytes, pass_tokens=pass_tokens)}
    if args.compile != "off":
        verifiers[args.compile] = TargetVerifier(
            loaded, kv_cache_bytes=args.kv_cache_bytes, pass_tokens=pass_tokens, compile_mode=args.compile
        )
    context = torch.randint(3, vocab, (args.context,), generator=g).tolist()
    greedy = SamplingParams()
    nxt = verifiers["eager"].verify("probe", context, DraftProposal([]), greedy).bonus_token
    wrong = (nxt + 1) % vocab  # x_1 never the target's token: every round rejects at once
    latency = {}
    for k in range(0, 9):
        item = VerifyItem("lat", context, DraftProposal([wrong] + [5] * (k - 1) if k else []), greedy)
        seconds = _time_passes(verifiers, [item], args.repeats, device)
        latency[k] = {name: 1000 * s for name, s in seconds.items()}
    throughput = {}
    for n in args.concurrency:
        items = [
            VerifyItem(
                f"c{n}-{i}", torch.randint(3, vocab, (args.context,), generator=g).tolist(), DraftProposal([]), greedy
            )
            for i in range(n)
        ]
        seconds = _time_passes(verifiers, items, args.repeats, device)
        throughput[n] = {name: {"pass_ms": 1000 * s, "tokens_per_s": n / s} for name, s in seconds.items()}
        for verifier in verifiers.values():
            for item in items:
                verifier.end_session(item.session_id)
    return {"verify_ms_by_k": latency, "decode_by_concurrency": throughput}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.gpu_engine", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default=None, help="load_model spec (default: the embedded Gemma 3 270M)")
    p.add_argument("--family", choices=family_passes.FAMILIES, help="a random model of this family, not --model")
    p.add_argument("--layers", type=int, default=18, help="with --family: its decoder layers (default 18)")
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--context", type=int, default=512, help="tokens each session holds (default 512)")
    p.add_argument("--concurrency", default="1,4,16,64,128", help="sessions per decode pass, comma separated")
    flags.add_repeats(p, 10, "timed passes per cell; medians")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens the exactness check generates (default 48)")
    p.add_argument("--kv-cache-bytes", type=int, default=4 << 30, help="the KV pool (default 4 GiB)")
    p.add_argument(
        "--compile",
        choices=[mode for mode in COMPILE_MODES if mode != "off"] + ["off"],
        default="off",
        help="also time a compiled verifier beside the eager one (and check exactness compiled)",
    )
    flags.add_json(p)
    args = p.parse_args(argv)
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    if args.family:
        loaded = random_family(args.family, args.layers, DTYPES[args.dtype], device)
    else:
        loaded = load_model(args.model, dtype=DTYPES[args.dtype], device=device)
    result = {"model": loaded.name, "device": str(device), "dtype": args.dtype, "compile": args.compile}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    result["exactness"] = exactness(loaded, args)
    result.update(latency_and_throughput(loaded, args, device))
    exact = result["exactness"]
    print(f"{loaded.name} on {result.get('gpu', device)} in {args.dtype}")
    print(f"  greedy speculative == target-only (k = 1..8): {exact['speculative_equal']}", end="")
    print(f"  (tokens agreeing by k: {exact['speculative_agrees_with_target_only']})")
    agree = f"{exact['hf_generate_agrees']}/{exact['new_tokens']}"
    print(f"  target-only tokens agreeing with transformers' generate: {agree}")
    print(f"  batched verify == one at a time: {exact['batched_equal']}")
    for name in result["verify_ms_by_k"][0]:
        by_k = result["verify_ms_by_k"].items()
        print(f"  verify ms by k ({name}):  " + "  ".join(f"{k}: {cell[name]:.1f}" for k, cell in by_k))
        for n, cells in result["decode_by_concurrency"].items():
            cell = cells[name]
            print(f"  {n:>4} sessions ({name}): {cell['pass_ms']:8.1f} ms a pass, {cell['tokens_per_s']:9.1f} tokens/s")
    if args.compile != "off":
        eager, compiled = "eager", args.compile
        cells_by_n = result["decode_by_concurrency"].values()
        ratios = [cells[eager]["pass_ms"] / cells[compiled]["pass_ms"] for cells in cells_by_n]
        print(f"  {compiled} speedup by concurrency (eager ms / compiled ms): " + "  ".join(f"{r:.2f}" for r in ratios))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    # fp32 must be exact; bf16 reports (see the docstring).
    return 0 if args.dtype == "bf16" or (exact["speculative_equal"] and exact["batched_equal"]) else 1


if __name__ == "__main__":
    sys.exit(main())
