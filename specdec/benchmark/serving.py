"""Servers side by side: `specdec up` against vLLM's OpenAI server, through one OpenAI client.

Two workloads. cold, the headline: prompts written for the benchmark (cold_prompts.py),
each sent once in a server's life, on fresh servers for every repeat (cold.py): what
a server meets in production. repeat: each set's few prompts sent again at every level and every
repeat to one long-lived server of each kind, the suffix cache's home ground (it learns every
completion), reported beside the cold figures, never as the headline.

What a user choosing a server measures: the same prompts (as token ids, so both tokenize alike)
sent to each server's `/v1/completions`, streamed, greedy, `ignore_eos` so that every request
makes exactly `max_tokens` tokens, serially and as N concurrent streams. Arms:

  specdec_off   `specdec up`'s HTTP API, speculation off per request (target-only through our stack)
  specdec       the same server, its default drafter
  vllm          vLLM's OpenAI server on the same model directory, no speculation
  vllm_ngram    a second vLLM server with its n-gram speculation (`--peer-ngram K`), when asked
  transformers  transformers' own `generate`, greedy, in this process, at one stream only

Each repeat runs every arm once per (prompt set, concurrency) in a fresh seeded order, so a busy
neighbour slows all alike; each figure is the median over repeats, each ratio (x vllm, and the
default over speculation off) the median of the repeats' paired ratios. With m prompts, each of N
streams runs max(1, m // N) requests back to back, stream i starting at prompt i. Per level:
tokens/s (all tokens over the wave's wall time), time to first token and inter-token latency
(the gaps between streamed chunks; a speculative chunk may hold several tokens) and time per
output token (a request's time after its first chunk over the tokens after it) at p50 / p99
over the repeats' requests. In the repeat workload, a set's first wave is the default drafter's, so its first cell meets
a suffix cache that has seen none of the set's completions. Every output is compared token for
token with the first output of its prompt (both servers return token ids: `return_token_ids`); a
run with any difference exits with status 1.

Only one arm runs at a time; the other servers sit idle beside it (an idle vLLM polls at 2-6 % of
a core, an idle stack at 1-2 %). vLLM is not a dependency: it runs from the Python named by
`--peer-python` (a venv of its own, bench/README.md), or a server already running at
`--peer-url`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import random
import sys
from pathlib import Path

from specdec.benchmark.servers import Server
from specdec.benchmark.waves import PERCENTILES, paired_ratios, summarise, transformers_wave, wave

ARMS = ("specdec_off", "specdec", "vllm", "vllm_ngram", "transformers")


async def measure(
    servers: dict[str, Server],
    hf_model,
    sets: dict[str, list[list[int]]],
    levels: list[int],
    new_tokens: int,
    repeats: int,
    seed: int = 0,
    progress=None,
) -> dict:
    """Every arm at every (set, level), `repeats` times in seeded orders. Returns
    {set: {level: {arm: summary}}} and the mismatches found (arm, set, prompt)."""
    rng = random.Random(seed)
    arms = list(servers) + (["transformers"] if hf_model is not None else [])
    raw: dict = {}
    reference: dict[tuple[str, int], list[int]] = {}
    mismatches: list[dict] = []
    for _ in range(repeats):
        for name, prompts in sets.items():
            for level in levels:
                order = [a for a in arms if a != "transformers" or level == 1]
                rng.shuffle(order)
                # A set's first wave goes to the default drafter: its first cell is then cold, the
                # suffix cache holding no completion of these prompts (every later wave, of any
                # arm, teaches it them). The first outputs are the reference all must equal.
                if "specdec" in order and not any(k[0] == name for k in reference):
                    order.remove("specdec")
                    order.insert(0, "specdec")
                for arm in order:
                    if arm == "transformers":
                        runs, seconds = await asyncio.to_thread(transformers_wave, hf_model, prompts, new_tokens)
                    else:
                        runs, seconds = await wave(servers[arm], prompts, level, new_tokens)
                    cell = raw.setdefault(name, {}).setdefault(level, {}).setdefault(arm, ([], [], []))
                    cell[0].extend(runs)
                    cell[1].append(seconds)
                    cell[2].append(sum(len(r.token_ids) for r in runs))
                    for r in runs:
                        ref = reference.setdefault((name, r.prompt), r.token_ids)
                        if r.token_ids != ref:
                            mismatches.append({"arm": arm, "set": name, "prompt": r.prompt, "level": level})
                    if progress is not None:
                        progress.update(1)
    table = {
        name: {level: {arm: summarise(*cell) for arm, cell in by_arm.items()} for level, by_arm in by_level.items()}
        for name, by_level in raw.items()
    }
    for by_level in table.values():
        for by_arm in by_level.values():
            paired_ratios(by_arm)
    return {"table": table, "mismatches": mismatches}


def report(result: dict, levels: list[int]) -> str:
    cpu_ = result.get("config", {}).get("cpu")
    lines = [f"CPU: {cpu_['model']} ({' '.join(cpu_['vector_extensions']) or 'no vector flags read'})"] if cpu_ else []
    for name, by_level in result["table"].items():
        arms = [a for a in ARMS if any(a in by_level[lv] for lv in by_level)]
        what = "cold: each prompt once in a server's life" if name == "cold" else f"repeat, set {name}"
        lines.append(f"\n== {what}: tokens/s (median), x vllm (median of paired repeats) ==")
        lines.append(f"{'arm':<14}" + "".join(f"{str(lv) + ' streams':>22}" for lv in levels))
        for arm in arms:
            cells = []
            for lv in levels:
                s = by_level[lv].get(arm)
                ratio = f" ({s['x']['vllm']:.2f}x)" if s and "vllm" in s["x"] else ""
                cells.append(f"{s['tokens_per_s']:.1f}{ratio}" if s else "-")
            lines.append(f"{arm:<14}" + "".join(f"{c:>22}" for c in cells))
        if "specdec" in arms and "specdec_off" in arms:  # the load-aware budget: never below off
            cells = [f"{by_level[lv]['specdec']['x']['specdec_off']:.3f}x" for lv in levels]
            lines.append(f"{'x off, paired':<14}" + "".join(f"{c:>22}" for c in cells))
        if "specdec" in arms and "specdec_off" in arms and name != "cold":
            # A set's first cell (its first repeat, one stream, the set's first wave): the default
            # drafter's suffix cache has seen none of its completions there; later cells serve
            # prompts it has seen many times.
            first = by_level[levels[0]]["specdec"]
            ratio = f" ({first['x_first']['vllm']:.2f}x)" if "vllm" in first["x_first"] else ""
            cells = [f"{first['tokens_per_s_repeats'][0]:.1f}{ratio}"] + ["-"] * (len(levels) - 1)
            lines.append(f"{'specdec, 1st':<14}" + "".join(f"{c:>22}" for c in cells))
        lines.extend(latency_lines(by_level, arms, levels))
    bad = result["mismatches"]
    lines.append(f"\noutputs equal: {'yes' if not bad else f'NO ({len(bad)} differ: {bad[:4]})'}")
    return "\n".join(lines)


def latency_lines(by_level: dict, arms: list[str], levels: list[int]) -> list[str]:
    """Per arm and level: ms at p50 / p90 / p99 of the time to first token, the gap between
    chunks and each token's share of it, and the tokens a chunk brought (a round's commit)."""
    lines = [f"{'latency, ms':<22}{'ttft p50/p90/p99':>22}{'chunk gap':>22}{'token gap':>22}{'tok/chunk':>10}"]
    for arm in arms:
        for lv in levels:
            s = by_level[lv].get(arm)
            if not s or s["itl_p50_ms"] is None:
                continue
            cells = ["/".join(f"{s[f'{name}_p{q}_ms']:.0f}" for q in PERCENTILES) for name in ("ttft", "itl")]
            cells.append("/".join(f"{s[f'token_gap_p{q}_ms']:.1f}" for q in PERCENTILES))
            lines.append(
                f"  {arm:<12}{lv:>3} str" + "".join(f"{c:>22}" for c in cells) + f"{s['tokens_per_chunk']:>10.2f}"
            )
    return lines


SETS = ("free", "free_heldout", "similar", "similar_heldout")


def prompt_sets(tokenizer, names: list[str], n: int, max_tokens: int = 0) -> dict[str, list[list[int]]]:
    """Token ids of the first `n` prompts of each named set (heldout.py: free text and
    similar requests, each as a tuning and a held-out set), cut to their last `max_tokens` (0: whole)."""
    from specdec.benchmark import heldout

    kinds = heldout.sets()
    out = {}
    for name in names:
        kind, _, part = name.partition("_")
        texts = kinds["free" if kind == "free" else "repeated"]["heldout" if part else "tuning"][:n]
        out[name] = [tokenizer(text)["input_ids"][-max_tokens:] for _, text in texts]
    return out


WORKLOADS = ("cold", "repeat")


async def run(args) -> dict:
    """`specdec bench --peer vllm`: the cold workload on fresh servers per repeat, then the repeat
    workload on one long-lived server of each kind."""
    from specdec.benchmark import cold
    from specdec.benchmark import servers as srv
    from specdec.runtime.models import load_checkpoint_tokenizer

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_checkpoint_tokenizer(args.target_model)
    model_dir = srv.model_directory(args.target_model, out_dir)
    hf = None if args.no_peer else _transformers_model(model_dir)
    arms = ["specdec_off", "specdec", "vllm"] + (["vllm_ngram"] if args.peer_ngram else [])
    result: dict = {"table": {}, "mismatches": []}
    from tqdm import tqdm

    if "cold" in args.peer_workload:
        prompts = cold.pool(tokenizer, args.max_prompt_tokens)
        plan = cold.assign(len(prompts), args.concurrency, args.cold_serial_prompts, args.repeats)
        reused = args.repeats * sum(cold.per_repeat(args.concurrency, args.cold_serial_prompts).values()) > len(prompts)
        if reused and args.peer_url:  # a peer we cannot restart must see each prompt once in its life
            raise SystemExit(f"--peer-url: {args.repeats} repeats need more cold prompts than the {len(prompts)}")
        warmup = tokenizer(cold.WARMUP_TEXT)["input_ids"]
        cells = args.repeats * (len(arms) * len(args.concurrency) + (hf is not None and 1 in args.concurrency))
        with tqdm(total=cells, desc="cold workload", unit="wave", file=sys.stderr) as progress:
            measured = await cold.measure(
                _launcher(args, model_dir, out_dir), arms, hf, prompts, plan, args.max_new_tokens, warmup,
                progress=progress,
            )  # fmt: skip
        result["table"].update(measured["table"])
        result["mismatches"] += measured["mismatches"]
        result["cold"] = {"prompts": len(prompts), "plan": plan, "prompts_reused_across_repeats": reused}
    if "repeat" in args.peer_workload:
        sets = prompt_sets(tokenizer, args.peer_sets, args.peer_prompts, args.max_prompt_tokens)
        measured = await _repeat(args, model_dir, out_dir, hf, sets)
        result["table"].update(measured["table"])
        result["mismatches"] += measured["mismatches"]
        result["repeat_sets"] = list(sets)
    from specdec.benchmark.provenance import git_commit

    result["config"] = {
        "workloads": args.peer_workload,
        "sets": args.peer_sets,
        "prompts": args.peer_prompts,
        "cold_serial_prompts": args.cold_serial_prompts,
        "levels": args.concurrency,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "peer_ngram": args.peer_ngram,
        "kv_gib": args.peer_kv_gib,
        "specdec_flags": args.specdec_flags,
        "model_dir": str(model_dir),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu": cpu(),
    }
    return result


def _launcher(args, model_dir: Path, out_dir: Path):
    """arm -> a fresh server of that arm, ready, and its stop (`cold.Launch`); a peer reached at
    --peer-url is the one server that is not started, nor stopped."""
    from specdec.benchmark import servers as srv

    async def launch(arm: str):
        log = out_dir / f"cold-{arm}.log"
        if arm in ("specdec", "specdec_off"):
            server = srv.start_specdec(args.target_model, f"{args.peer_kv_gib}GiB", log, args.specdec_flags)
            if arm == "specdec_off":
                server.extra = {"speculation": {"disabled": True}}
        elif args.peer_url and arm == "vllm":
            server = srv.Server(args.peer_url.rstrip("/"), "")
            await srv.wait_ready(server, arm, log)  # learns the model it serves
            return server, lambda: None
        else:
            ngram = args.peer_ngram if arm == "vllm_ngram" else 0
            server = srv.start_vllm(args.peer_python, model_dir, args.peer_kv_gib, log, ngram=ngram)
        try:
            await srv.wait_ready(server, arm, log)
        except BaseException:
            srv.stop(server)
            raise
        return server, lambda: srv.stop(server)

    return launch


async def _repeat(args, model_dir: Path, out_dir: Path, hf, sets: dict[str, list[list[int]]]) -> dict:
    """The repeat workload: every set at every level on one long-lived server of each kind."""
    from specdec.benchmark import servers as srv

    logs = {name: out_dir / f"{name}.log" for name in ("specdec", "vllm", "vllm_ngram")}
    ours = srv.start_specdec(args.target_model, f"{args.peer_kv_gib}GiB", logs["specdec"], args.specdec_flags)
    peers = {}
    try:
        if args.peer_url:
            peers["vllm"] = srv.Server(args.peer_url.rstrip("/"), "")
        else:
            peers["vllm"] = srv.start_vllm(args.peer_python, model_dir, args.peer_kv_gib, logs["vllm"])
        if args.peer_ngram:
            peers["vllm_ngram"] = srv.start_vllm(
                args.peer_python, model_dir, args.peer_kv_gib, logs["vllm_ngram"], ngram=args.peer_ngram
            )
        # One at a time: two vLLM servers compiling at once would take each other's cores.
        await srv.wait_ready(ours, "specdec up", logs["specdec"])
        for name, server in peers.items():
            await srv.wait_ready(server, name, logs.get(name, out_dir))
        servers = {
            "specdec_off": srv.Server(ours.url, ours.model, {"speculation": {"disabled": True}}),
            "specdec": srv.Server(ours.url, ours.model),
            **peers,
        }
        cells = sum(len(args.concurrency) * len(servers) + (hf is not None) for _ in sets) * args.repeats
        from tqdm import tqdm

        with tqdm(total=cells, desc="repeat workload", unit="wave", file=sys.stderr) as progress:
            return await measure(
                servers, hf, sets, args.concurrency, args.max_new_tokens, args.repeats, progress=progress
            )
    finally:
        for server in (ours, *peers.values()):
            srv.stop(server)


_VECTOR_FLAGS = ("avx", "amx", "fma", "f16c", "sse4", "asimd", "sve", "neon")


def cpu() -> dict:
    """The CPU's model and vector extensions (Linux: /proc/cpuinfo; kernels are picked by them)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model in ("", platform.processor(), platform.machine()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = sorted(f for f in value.split() if f.startswith(_VECTOR_FLAGS))
    except OSError:
        pass
    return {"model": model, "vector_extensions": flags}


def _transformers_model(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def main(args) -> int:
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=1, default=str)
    (Path(args.out) / "peer_vllm.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    print(report(result, args.concurrency))
    print(f"wrote {Path(args.out) / 'peer_vllm.json'}", file=sys.stderr)
    return 0 if not result["mismatches"] else 1
