"""Target tier: verify latency vs k, and verified tokens/s batched vs one at a time, in-process and over Ray.

  python -m specdec.bench.verify_pool [--repeats 5] [--models tiny,gemma] [--no-ray] [--quick] [--json PATH]

Per model (a tiny random llama, and the embedded Gemma 3 270M in fp32):

(a) Latency vs k. One session holds a cached context of --context tokens; a round re-sends that
    context with k random drafts, so every round does the same work: the verifier rolls back to
    the context minus its last token and scores [last token, x_1..x_k] (k+1 positions). The
    drafts are random but x_1 is never the target's next token, so every round rejects at x_1
    and the session's context never grows (after an accepted draft the actor would hold more
    than the re-sent context, which the pool's protocol does not allow). With Ray, the same
    rounds through `TargetPool.verify` on an actor with nothing else queued (batch 1);
    overhead = pool - in-process.
(b) Throughput. N sessions (contexts of about --context tokens, lengths differ) each verify one
    round of k = --k per step: scored positions ("verified tokens", k+1 per round) per second.
    Batched = one `verify_batch` over all N; one at a time = a loop of `verify`. Session i's
    drafts agree with the target's greedy continuation for its first i mod (k+1) tokens, so the
    accepted counts span 0..k and the batched and one-at-a-time outputs are compared on rounds
    that accept something.
(c) With Ray, N concurrent `TargetPool.verify` calls per step against an actor that batches
    whatever is queued (max_batch 32) and one that verifies a call at a time (max_batch 1),
    with the reject-at-x_1 drafts of (a). Also the Ray floor: an `info` call (no model work).

Each repeat runs every case for at least --min-time (at least one call; the count is fixed at the
warm-up pass), batched next to unbatched, in-process next to pool, so drift on the machine hits
them alike; tables show medians over --repeats.

Threads: Ray sets OMP_NUM_THREADS to an actor's num_cpus, and CPU target actors take one CPU,
so actors run torch on one thread. The bench runs the in-process verifier on --threads (default
1, the same) and passes --threads to the actors through OMP_NUM_THREADS.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bench never downloads a model

import torch  # noqa: E402

from specdec.benchmark import flags  # noqa: E402
from specdec.benchmark.tiny_llama import make_tiny_llama  # noqa: E402
from specdec.core.acceptance import DraftProposal, Verification  # noqa: E402
from specdec.core.sampling import SamplingParams  # noqa: E402
from specdec.runtime.loading import load_model  # noqa: E402
from specdec.runtime.models import LoadedModel  # noqa: E402
from specdec.target_service.verifier import TargetVerifier, VerifyItem  # noqa: E402

GREEDY = SamplingParams()
MODELS = {"tiny": "tiny llama (hidden 64, 2 layers, vocab 259)", "gemma": "gemma-3-270m (embedded, fp32)"}


@dataclass
class Session:
    session_id: str
    context: list[int]  # committed tokens, cached after the warm-up
    drafts: list[int]  # the k drafts of the round it repeats


@dataclass
class Setup:
    verifier: TargetVerifier
    latency: dict[int, Session]  # k -> the one latency session (same context) with k drafts
    batch: list[Session]  # throughput sessions, drafts accepted for their first i mod (k+1) tokens
    rejecting: list[Session]  # the same contexts with drafts rejected at x_1 (for the pools)
    expected: list[list[int]]  # per throughput session, the accepted ids its drafts were built for


def _random_ids(rng: random.Random, n: int, vocab: int, avoid: int | None = None) -> list[int]:
    """n random ids in [3, vocab) (past the tiny tokenizer's specials); the first is never `avoid`."""
    ids = [rng.randrange(3, vocab) for _ in range(n)]
    while n and ids[0] == avoid:
        ids[0] = rng.randrange(3, vocab)
    return ids


def _greedy_continuation(verifier: TargetVerifier, context: list[int], n: int) -> list[int]:
    """The target's next n greedy tokens, one unbatched k = 0 round each (a scratch session)."""
    tokens = list(context)
    for _ in range(n):
        tokens.append(verifier.verify("scratch", tokens, DraftProposal([]), GREEDY).bonus_token)
    verifier.end_session("scratch")
    return tokens[len(context) :]


def prepare(loaded: LoadedModel, args) -> Setup:
    verifier = TargetVerifier(loaded)
    vocab = min(loaded.vocab_size, len(loaded.tokenizer))
    rng = random.Random(0)
    context = _random_ids(rng, args.context, vocab)
    first = _greedy_continuation(verifier, context, 1)[0]
    latency = {k: Session("latency", context, _random_ids(rng, k, vocab, avoid=first)) for k in args.ks}
    batch, rejecting, expected = [], [], []
    for i in range(max(args.sessions)):
        ctx = _random_ids(rng, args.context + rng.randint(-args.context // 8, args.context // 8), vocab)
        greedy = _greedy_continuation(verifier, ctx, args.k + 1)
        agree = i % (args.k + 1)
        drafts = greedy[:agree] + _random_ids(rng, args.k - agree, vocab, avoid=greedy[agree])
        batch.append(Session(f"s{i}", ctx, drafts))
        rejecting.append(Session(f"s{i}", ctx, _random_ids(rng, args.k, vocab, avoid=greedy[0])))
        expected.append(greedy[: agree + 1])
    return Setup(verifier, latency, batch, rejecting, expected)


def _item(s: Session) -> VerifyItem:
    return VerifyItem(s.session_id, s.context, DraftProposal(s.drafts), GREEDY)


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


async def _atimed(coro):
    start = time.perf_counter()
    result = await coro
    return time.perf_counter() - start, result


def _ids(results: list[Verification]) -> list[list[int]]:
    return [r.accepted_ids for r in results]


class Pools:
    """Two single-actor pools on a local Ray: continuous batching (max_batch 32) and max_batch 1."""

    def __init__(self, spec: str | None, threads: int):
        import ray

        from specdec.target_service.actor import ActorConfig
        from specdec.target_service.pool import PoolConfig, TargetPool, launch
        from specdec.target_service.ray_cluster import connect

        self._omp = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(threads)  # Ray's workers inherit it (else they get num_cpus)
        connect(None, "specdec-bench", num_cpus=2)
        self.ray = ray
        self.pools = {}
        for prefix, max_batch in (("bench-target", 32), ("bench-target-single", 1)):
            launch(ActorConfig(target_model=spec, max_batch=max_batch), 1, prefix=prefix, namespace="specdec-bench")
            self.pools[max_batch] = TargetPool(PoolConfig(prefix=prefix, namespace="specdec-bench"))
        self.batched, self.single = self.pools[32], self.pools[1]

    def actor(self, pool):
        return next(iter(pool.actors.values()))

    async def batch_sizes(self, pool) -> list[int]:
        return (await self.actor(pool).info.remote())["batch_sizes"]

    async def floor(self, calls: int = 50) -> float:
        """Median seconds of an `info` call: a Ray actor round trip with no model work."""
        actor, samples = self.actor(self.batched), []
        for _ in range(calls):
            samples.append((await _atimed(actor.info.remote()))[0])
        return statistics.median(samples)

    def kill(self) -> None:
        for pool in self.pools.values():
            for actor in pool.actors.values():
                self.ray.kill(actor, no_restart=True)
        self.ray.shutdown()
        if self._omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = self._omp


async def _pool_round(pool, sessions: list[Session]) -> list[Verification]:
    return await asyncio.gather(
        *(pool.verify(s.session_id, s.context, DraftProposal(s.drafts), GREEDY) for s in sessions)
    )


class Sampler:
    """Times each case `count` times per repeat: enough calls to last --min-time, fixed at the
    warm-up (where the case runs twice, the second call timed) so every repeat does the same."""

    def __init__(self, min_time: float):
        self.min_time, self.counts = min_time, {}

    def _count(self, key, seconds: float) -> None:
        self.counts[key] = max(1, math.ceil(self.min_time / seconds))

    def run(self, key, fn) -> list[tuple[float, object]]:
        if key not in self.counts:
            fn()
            self._count(key, _timed(fn)[0])
            return []
        return [_timed(fn) for _ in range(self.counts[key])]

    async def arun(self, key, make) -> list[tuple[float, object]]:
        if key not in self.counts:
            await make()
            self._count(key, (await _atimed(make()))[0])
            return []
        return [await _atimed(make()) for _ in range(self.counts[key])]


async def measure(setup: Setup, pools: Pools | None, args) -> dict:
    """One warm-up pass, then --repeats passes over every case, interleaved; per-case samples."""
    v, sampler, med = setup.verifier, Sampler(args.min_time), statistics.median
    lat: dict[str, dict[int, list[float]]] = {"in_process": {k: [] for k in args.ks}, "pool": {k: [] for k in args.ks}}
    names = ("batched", "one_at_a_time", "pool_batched", "pool_single")
    tput: dict[str, dict[int, list[float]]] = {name: {n: [] for n in args.sessions} for name in names}
    outputs: dict[str, list[list[list[int]]]] = {name: [] for name in names}  # at the most sessions, every call
    forwards: dict[int, list[int]] = {n: [] for n in args.sessions}  # batch sizes of the batching actor's forwards
    calls: dict[int, int] = {n: 0 for n in args.sessions}  # pool steps those forwards served

    def rate(key: str, n: int, samples: list[tuple[float, list[Verification]]]) -> None:
        if samples:
            tput[key][n].append(n * (args.k + 1) * len(samples) / sum(s for s, _ in samples))
            if n == max(args.sessions):
                outputs[key] += [_ids(r) for _, r in samples]

    for repeat in range(args.repeats + 1):  # pass 0 is the warm-up (prefills, first shapes, counts)
        for k in args.ks:
            s = setup.latency[k]
            samples = sampler.run(
                ("lat", k), lambda: v.verify(s.session_id, s.context, DraftProposal(s.drafts), GREEDY)
            )
            lat["in_process"][k] += [med(t for t, _ in samples)] if samples else []
            if pools:
                samples = await sampler.arun(("pool lat", k), lambda: _pool_round(pools.batched, [s]))
                lat["pool"][k] += [med(t for t, _ in samples)] if samples else []
        for n in args.sessions:
            items = [_item(s) for s in setup.batch[:n]]
            rate("batched", n, sampler.run(("batched", n), lambda: v.verify_batch(items)))
            rate(
                "one_at_a_time",
                n,
                sampler.run(
                    ("single", n), lambda: [v.verify(i.session_id, i.tokens, i.proposal, i.sampling) for i in items]
                ),
            )
            if pools:
                before = len(await pools.batch_sizes(pools.batched))
                samples = await sampler.arun(
                    ("pool batched", n), lambda: _pool_round(pools.batched, setup.rejecting[:n])
                )
                if samples:
                    forwards[n] += (await pools.batch_sizes(pools.batched))[before:]
                    calls[n] += len(samples)
                rate("pool_batched", n, samples)
                rate(
                    "pool_single",
                    n,
                    await sampler.arun(("pool single", n), lambda: _pool_round(pools.single, setup.rejecting[:n])),
                )
        print(f"  {'repeat ' + str(repeat) if repeat else 'warm-up'} done", file=sys.stderr)
    return {"latency": lat, "throughput": tput, "outputs": outputs, "forwards": forwards, "steps": calls}


def summarize(name: str, setup: Setup, raw: dict, floor: float | None, args) -> dict:
    med = statistics.median
    latency = []
    for k in args.ks:
        row = {"k": k, "in_process_ms": med(raw["latency"]["in_process"][k]) * 1e3}
        row["positions_per_s"] = (k + 1) / row["in_process_ms"] * 1e3
        if raw["latency"]["pool"][k]:
            row["pool_ms"] = med(raw["latency"]["pool"][k]) * 1e3
            row["ray_overhead_ms"] = row["pool_ms"] - row["in_process_ms"]
        latency.append(row)
    throughput = []
    for n in args.sessions:
        t = {key: med(v[n]) if v[n] else None for key, v in raw["throughput"].items()}
        row = {
            "sessions": n,
            "batched_tok_s": t["batched"],
            "one_at_a_time_tok_s": t["one_at_a_time"],
            "ratio": t["batched"] / t["one_at_a_time"],
        }
        if t["pool_batched"] is not None:
            sizes = raw["forwards"][n]
            row |= {
                "pool_batched_tok_s": t["pool_batched"],
                "pool_single_tok_s": t["pool_single"],
                "pool_ratio": t["pool_batched"] / t["pool_single"],
                # What a batched pass costs through the actor over the same-sized pass in process.
                "actor_over_in_process": t["batched"] / t["pool_batched"],
            }
            row["pool_forwards_per_step"] = len(sizes) / raw["steps"][n]
        throughput.append(row)
    out = raw["outputs"]
    expected_rejects = [s_expected[:1] for s_expected in setup.expected]  # reject at x_1: the target's first token
    result = {
        "model": MODELS[name],
        "latency": latency,
        "throughput": throughput,
        "accepted_batched": out["batched"][-1],
        "accepted_one_at_a_time": out["one_at_a_time"][-1],
        "identical": all(b == s for b, s in zip(out["batched"], out["one_at_a_time"])),
        "as_constructed": out["batched"][-1] == setup.expected,
        "num_accepted": [len(ids) - 1 for ids in out["batched"][-1]],
    }
    if out["pool_batched"]:
        result["pool_identical"] = all(
            b == s == expected_rejects for b, s in zip(out["pool_batched"], out["pool_single"])
        )
        result["ray_floor_ms"] = floor * 1e3
    return result


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """columns: (header, key, format); missing keys print as '-'."""
    cells = [[fmt.format(row[key]) if row.get(key) is not None else "-" for _, key, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, (h, _, _) in enumerate(columns)]
    lines = [
        "| " + " | ".join(h.ljust(w) for (h, _, _), w in zip(columns, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(row, widths)) + " |" for row in cells]
    return "\n".join(lines)


def report(result: dict, args, ray: bool) -> None:
    print(f"\n## {result['model']}\n")
    print(
        f"Verify latency vs k, one session, context {args.context} tokens cached; "
        f"per-repeat median round, median over {args.repeats} repeats\n"
    )
    columns = [
        ("k", "k", "{}"),
        ("in-process ms", "in_process_ms", "{:.2f}"),
        ("positions/s", "positions_per_s", "{:.0f}"),
    ]
    if ray:
        columns += [("pool ms", "pool_ms", "{:.2f}"), ("Ray overhead ms", "ray_overhead_ms", "{:.2f}")]
    print(_table(result["latency"], columns))
    if ray:
        print(f"\nRay floor (an `info` call, no model work): {result['ray_floor_ms']:.2f} ms")
    print(
        f"\nVerified tokens/s (scored positions, k+1 = {args.k + 1} per round), "
        f"N sessions one round each per step; median over {args.repeats} repeats\n"
    )
    columns = [
        ("sessions", "sessions", "{}"),
        ("batched", "batched_tok_s", "{:.0f}"),
        ("one at a time", "one_at_a_time_tok_s", "{:.0f}"),
        ("ratio", "ratio", "{:.2f}"),
    ]
    if ray:
        columns += [
            ("pool batched", "pool_batched_tok_s", "{:.0f}"),
            ("pool max_batch 1", "pool_single_tok_s", "{:.0f}"),
            ("pool ratio", "pool_ratio", "{:.2f}"),
            ("actor/in-process", "actor_over_in_process", "{:.2f}"),
            ("forwards/step", "pool_forwards_per_step", "{:.1f}"),
        ]
    print(_table(result["throughput"], columns))
    print(
        f"\nbatched == one at a time (accepted ids, every repeat): {result['identical']}; "
        f"accepted per session {result['num_accepted']}"
    )
    if ray:
        print(f"pool batched == pool max_batch 1 == target's first token: {result['pool_identical']}")


async def run_model(name: str, root: Path, args) -> dict:
    spec = str(make_tiny_llama(root / "tiny", seed=1)) if name == "tiny" else None
    loaded = load_model(spec)
    setup = prepare(loaded, args)
    pools = Pools(spec, args.threads) if args.ray else None
    try:
        raw = await measure(setup, pools, args)
        floor = await pools.floor() if pools else None
    finally:
        if pools:
            pools.kill()
    result = summarize(name, setup, raw, floor, args)
    report(result, args, args.ray)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.verify_pool", description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--models", type=lambda s: s.split(","), default=["tiny", "gemma"], help="tiny, gemma")
    flags.add_repeats(p, 5)
    p.add_argument("--min-time", type=float, default=0.2, help="seconds each case runs per repeat, at least one call")
    p.add_argument("--ks", type=ints, default=[0, 1, 2, 4, 8, 12, 16], help="draft lengths of the latency table")
    flags.add_k(p, 4, "draft length of the throughput runs")
    p.add_argument("--sessions", type=ints, default=[1, 4, 8, 16])
    p.add_argument("--context", type=int, default=64, help="cached tokens per session (throughput: +-1/8)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, in-process and in the actors")
    p.add_argument("--no-ray", dest="ray", action="store_false", help="in-process verifier only")
    p.add_argument("--quick", action="store_true", help="tiny model, 2 repeats, --min-time 0.02: the smoke test")
    flags.add_json(p)
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.repeats, args.min_time = ["tiny"], 2, 0.02

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="verify-pool-bench-"))
    try:
        results = [asyncio.run(run_model(name, root, args)) for name in args.models]
    finally:
        torch.set_num_threads(threads)  # callers in the same process (the smoke test) get theirs back
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        meta = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, fp32, "
            f"{args.threads} thread(s)",
            "argv": sys.argv[1:] if argv is None else argv,
            "k": args.k,
            "context": args.context,
            "repeats": args.repeats,
            "min_time": args.min_time,
        }
        Path(args.json).write_text(json.dumps(meta | {"models": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
