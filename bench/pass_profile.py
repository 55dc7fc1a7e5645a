"""Where one target pass spends its time: the torch profiler over decode passes of R rows.

The verifier the actor runs (`TargetVerifier`, the same pool, kernels and greedy head), in this
process, with no transport: R sessions prefilled with a prompt of --context tokens, then
--passes greedy decode passes of one token a row, profiled. Each pass's wall time splits into
  head         the output projection (and the greedy screen), under `specdec.head`
  gemm         the decoder's linear layers (oneDNN's packed GEMM, or any mm)
  attention    scaled_dot_product_attention over the gathered blocks
  kv copies    writing the pass's keys and values into the pool and gathering them (index_copy_,
               index_select)
  elementwise  every other op: norms, rotary embedding, activations, residual adds, argmax
  python       the wall time outside any op: building the pass layout, transformers' modules
Op times are self CPU time on the calling thread (an op's intra-op threads work inside it), from
profiled passes; the wall time is the median of as many unprofiled passes run just before.

  python -m specdec.bench.pass_profile [--rows 1,16] [--context 128] [--passes 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdec.benchmark import flags
from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.runtime.projection import HEAD_LABEL

CATEGORIES = ("head", "gemm", "attention", "kv copies", "elementwise", "python")
_GEMM = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm")
_ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math")
_COPIES = ("aten::index_copy_", "aten::index_select")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.pass_profile", description=__doc__.split("\n\n")[0])
    flags.add_target_model(p)
    p.add_argument("--rows", default="1,16", help="rows a pass, comma separated (default 1,16)")
    p.add_argument("--context", type=int, default=128, help="prompt tokens a session (default 128)")
    p.add_argument("--passes", type=int, default=8, help="profiled passes per row count (default 8)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    flags.add_json(p)
    return p.parse_args(argv)


def split(events, passes: int, wall_ms: float) -> dict[str, float]:
    """ms a pass in each category, from the profiler's events (self CPU time)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    head_ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == HEAD_LABEL]
    for e in events:
        if e.name == HEAD_LABEL or e.name.startswith("specdec."):
            continue
        ms = e.self_cpu_time_total / 1000
        if any(a <= e.time_range.start and e.time_range.end <= b for a, b in head_ranges):
            out["head"] += ms
        elif e.name in _GEMM:
            out["gemm"] += ms
        elif e.name in _ATTENTION or e.name == "aten::scaled_dot_product_attention":
            out["attention"] += ms
        elif e.name in _COPIES:
            out["kv copies"] += ms
        else:
            out["elementwise"] += ms
    out = {k: v / passes for k, v in out.items()}
    out["python"] = max(0.0, wall_ms - sum(out.values()))
    out["wall"] = wall_ms
    return out


def measure(verifier, prompt: list[int], rows: int, passes: int) -> dict[str, float]:
    greedy = SamplingParams()
    from specdec.target_service.verifier import VerifyItem

    seqs = {f"r{rows}-{i}": [*prompt[:-1], 5 + i] for i in range(rows)}

    def step() -> None:
        results = verifier.verify_batch([VerifyItem(s, t, DraftProposal([]), greedy) for s, t in seqs.items()])
        for tokens, result in zip(seqs.values(), results):
            tokens.extend(result.accepted_ids)

    step()  # prefill
    step()  # warm
    walls = []
    for _ in range(passes):  # unprofiled: the profiler's own cost per op would count as Python
        started = time.perf_counter()
        step()
        walls.append(1000 * (time.perf_counter() - started))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            step()
    wall_ms = sorted(walls)[len(walls) // 2]
    for session in seqs:
        verifier.end_session(session)
    return split(prof.events(), passes, wall_ms)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from specdec.benchmark.prompts import FREE_PROSE_PROMPTS
    from specdec.runtime.loading import load_model
    from specdec.target_service.verifier import TargetVerifier

    loaded = load_model(args.target_model)
    verifier = TargetVerifier(loaded, kv_cache_bytes=1 << 30)
    text = " ".join(prompt for _, prompt in FREE_PROSE_PROMPTS) * 8
    prompt = loaded.tokenizer(text)["input_ids"][: args.context]
    result = {}
    print(f"{'rows':>5} " + " ".join(f"{c:>12}" for c in (*CATEGORIES, "wall")) + "   (ms a pass)")
    for rows in [int(r) for r in args.rows.split(",")]:
        split_ms = measure(verifier, prompt, rows, args.passes)
        result[rows] = split_ms
        print(f"{rows:>5} " + " ".join(f"{split_ms[c]:12.1f}" for c in (*CATEGORIES, "wall")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "ms_per_pass": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
