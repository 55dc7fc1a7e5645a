"""Drafters replayed over target-only outputs: tokens per round, no clocks.

Greedy speculation commits exactly the target's tokens, so a drafter's rounds on a request can
be replayed offline: each round the drafter sees the committed context, proposes, and the round
commits the draft's longest prefix (chains) or path (trees) that the target's own output
continues with, plus the target's next token. That isolates what a drafter predicts from what
the machine makes of it, in seconds and deterministically, which is how drafter constants are
chosen on the tuning sets (bench/heldout.py) before the timed benchmark (bench/drafters.py)
judges them on held-out ones through the stack. Arms:

  ngram         prompt lookup, k from the coordinator's adaptive policy (coordinator/adaptive.py)
  suffix        suffix decoding over the request and earlier completions, the same policy
  suffix+tree   its token trees, with the policy's k as the node budget
  oracle        an upper bound for any lookup: each round commits the longest continuation of any
                earlier occurrence of the context's last token, in the request or in an earlier
                completion of the set, at no verification cost (no tree or score can pick better
                from what was seen before)
  oracle_longest the same among the occurrences that match the longest suffix of the context only:
                a perfect choice among the candidates the context's evidence ranks first, which
                is where a drafter's own choices are wrong (what a tree must cover)
  draft@m       with --draft: how often the target's next token is among the draft model's m most
                likely (teacher-forced along the target's output): the first level of any tree of
                that model's candidates is accepted at most that often

The policy prices a pass over n positions at 1 + slope * (n - 1) rounds (--slope; measured on
this CPU through the stack, an extra position costs 1-3 % of a round), and "x n-gram" is tokens
per priced round over n-gram's.

  python -m specdec.bench.drafter_rounds [--kind K ...] [--outputs PATH] [--draft SPEC] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from specdec.bench import heldout
from specdec.bench.single_process import _git_commit
from specdec.coordinator.adaptive import CostModel, DraftLengthPolicy, DraftLengths
from specdec.coordinator.engine import EngineConfig
from specdec.core.acceptance import DraftProposal
from specdec.core.tree import depths, walk
from specdec.draft_service.ngram import NgramDrafter
from specdec.draft_service.suffix import SuffixDrafter
from specdec.drafts import loading as draft_loading
from specdec.runtime.loading import load_model
from specdec.runtime.models import LoadedModel

ARMS = ("ngram", "suffix", "suffix+tree", "oracle", "oracle_longest")
ORACLES = ("oracle", "oracle_longest")
DRAFT_TOP = (1, 2, 4, 8)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m specdec.bench.drafter_rounds",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--kind", action="append", choices=("repeated", "free", "copy"), help="default: all")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per request (default 48)")
    p.add_argument("--k", type=int, default=16, help="the most draft tokens (tree nodes) per round (default 16)")
    p.add_argument("--slope", type=float, default=0.02, help="a pass's extra cost per position, in rounds")
    p.add_argument("--target-model", default=None, help="default: the embedded Gemma 3 270M")
    p.add_argument("--draft", default=None, metavar="SPEC", help="also measure this draft model's top-m coverage")
    p.add_argument("--outputs", default=None, metavar="PATH", help="target outputs: read if present, else written")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    args.kind = list(dict.fromkeys(args.kind or ("repeated", "free", "copy")))
    if args.max_new_tokens < 1 or args.k < 1 or args.slope < 0:
        p.error("--max-new-tokens and --k must be >= 1, --slope >= 0")
    return args


def target_outputs(args: argparse.Namespace) -> dict[str, dict[str, list[int]]]:
    """{"kind/set/label": {"prompt": ids, "output": ids}}: greedy, EOS off, from the target."""
    path = Path(args.outputs) if args.outputs else None
    if path is not None and path.exists():
        return json.loads(path.read_text())
    target = load_model(args.target_model)
    outputs = {}
    for kind in args.kind:
        for name, rows in heldout.sets()[kind].items():
            for label, text in rows:
                prompt = target.tokenizer(text)["input_ids"]
                with torch.no_grad():
                    ids = target.model.generate(
                        torch.tensor([prompt]),
                        max_new_tokens=args.max_new_tokens,
                        do_sample=False,
                        eos_token_id=None,
                        pad_token_id=0,
                    )
                outputs[f"{kind}/{name}/{label}"] = {"prompt": prompt, "output": ids[0, len(prompt) :].tolist()}
                print(f"target output: {kind}/{name}/{label}", file=sys.stderr)
    if path is not None:
        path.write_text(json.dumps(outputs))
    return outputs


def accepted(tokens: Sequence[int], parents: Sequence[int], truth: Sequence[int]) -> int:
    """How many of `truth` the target's walk (`specdec.core.tree.walk`) accepts through the tree
    (a chain: the common prefix). Only nodes on the walk are read, and a node at depth d is on
    it only if its path is truth's first d tokens, so the target's token there is truth[d]."""
    if not truth:
        return 0
    at_nodes = [truth[d] if d < len(truth) else -1 for d in depths(parents)]  # -1: past the output, no token
    path, _ = walk([truth[0], *at_nodes], tokens, parents)
    return len(path)


def oracle(
    context: Sequence[int], earlier: Sequence[Sequence[int]], truth: Sequence[int], *, longest: bool = False
) -> int:
    """The longest prefix of `truth` that follows any earlier occurrence of the context's last token
    (`longest`: any occurrence among those matching the longest suffix of the context, up to 32
    tokens, that any occurrence matches)."""
    found: list[tuple[int, int]] = []  # (context suffix matched, prefix of truth that follows)
    sources = [(context[:-1], context), *((text, text) for text in earlier)]  # (where to look, what follows)
    for where, text in sources:
        for at, token in enumerate(where):
            if token != context[-1]:
                continue
            n = 0
            while n < len(truth) and at + 1 + n < len(text) and text[at + 1 + n] == truth[n]:
                n += 1
            matched = 1
            while longest and matched < min(32, at + 1, len(context)) and text[at - matched] == context[-1 - matched]:
                matched += 1
            found.append((matched, n))
    if not found:
        return 0
    evidence = max(matched for matched, _ in found)
    return max(n for matched, n in found if matched == evidence)


def replay(requests: list[dict[str, list[int]]], arm: str, args: argparse.Namespace) -> dict[str, float]:
    """Serve the set's requests in turn with one arm: tokens per round and per priced round."""

    def cost(positions: int) -> float:
        return 1.0 + args.slope * (positions - 1)

    costs = CostModel()
    for n in range(1, args.k + 2):
        costs.observe_verify(n, cost(n))
    suffix = SuffixDrafter()
    earlier: list[list[int]] = []  # the set's completions so far (the oracle's cache)
    tokens = rounds = 0
    priced = 0.0
    for request in requests:
        output = request["output"][: args.max_new_tokens]
        context = list(request["prompt"])
        ngram = NgramDrafter()
        policy = DraftLengthPolicy(EngineConfig(max_draft_tokens=args.k), costs, set(), greedy=True)
        done = 0
        while done < len(output):
            truth = output[done:]
            if arm in ORACLES:
                hit, positions = oracle(context, earlier, truth[: args.k], longest=arm == "oracle_longest"), 1
            else:
                k = policy.choose(args.k, 1).k
                draft, parents = _propose(arm, ngram, suffix, context, k) if k > 0 else ([], [])
                hit, positions = accepted(draft, parents, truth), len(draft) + 1
                source = "ngram" if arm == "ngram" else "suffix"
                planned = DraftLengths(k, None, "adaptive")
                policy.observe(planned, DraftProposal(draft, source=source), False, hit, 0.0, cost(positions))
            step = min(hit + 1, len(truth))
            context += truth[:step]
            done += step
            rounds += 1
            priced += cost(positions)
        tokens += len(output)
        suffix.learn(output)
        earlier.append(output)
    return {"tokens_per_round": tokens / rounds, "tokens_per_priced_round": tokens / priced}


def _propose(arm, ngram: NgramDrafter, suffix: SuffixDrafter, context, k) -> tuple[list[int], list[int]]:
    if arm == "ngram":
        draft = ngram.propose(context, k)
    elif arm == "suffix":
        draft = suffix.propose(context, k)
    else:
        return suffix.propose_tree(context, k)
    return draft, list(range(-1, len(draft) - 1))


def draft_coverage(draft: LoadedModel, requests: list[dict[str, list[int]]], max_new_tokens: int) -> dict[str, float]:
    """Share of the target's output tokens among the draft's top-m, teacher-forced."""
    hits = dict.fromkeys(DRAFT_TOP, 0)
    total = 0
    for request in requests:
        output = request["output"][:max_new_tokens]
        ids = torch.tensor([request["prompt"] + output])
        with torch.no_grad():
            logits = draft.model(ids).logits[0, len(request["prompt"]) - 1 : -1]
        top = torch.topk(logits.float(), max(DRAFT_TOP), dim=-1).indices
        truth = torch.tensor(output)[:, None]
        for m in DRAFT_TOP:
            hits[m] += int((top[:, :m] == truth).any(dim=1).sum())
        total += len(output)
    return {f"draft@{m}": hits[m] / total for m in DRAFT_TOP}


def measure(args: argparse.Namespace) -> dict:
    outputs = target_outputs(args)
    sets: dict[str, list[dict[str, list[int]]]] = {}
    for key, request in outputs.items():
        kind, name, _ = key.split("/", 2)
        if kind in args.kind:
            sets.setdefault(f"{kind}/{name}", []).append(request)
    results: dict = {
        "sets": {},
        "config": {
            **vars(args),
            "commit": _git_commit(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
    }
    draft = draft_loading.load_model(args.draft) if args.draft else None
    for name, requests in sets.items():
        row = {arm: replay(requests, arm, args) for arm in ARMS}
        base = row["ngram"]["tokens_per_priced_round"]
        for arm in ARMS:
            row[arm]["over_ngram"] = row[arm]["tokens_per_priced_round"] / base
        if draft is not None:
            row["draft_coverage"] = draft_coverage(draft, requests, args.max_new_tokens)
        results["sets"][name] = row
    return results


def print_report(results: dict) -> None:
    print(f"{'set':<18} " + " ".join(f"{arm:>18}" for arm in ARMS))
    for name, row in results["sets"].items():
        cells = " ".join(f"{row[a]['tokens_per_round']:>8.2f}t {row[a]['over_ngram']:>6.2f}n" for a in ARMS)
        coverage = row.get("draft_coverage")
        extra = "  " + " ".join(f"{k} {v:.0%}" for k, v in coverage.items()) if coverage else ""
        print(f"{name:<18} {cells}{extra}")
    print("cells: tokens per round, and per priced round over n-gram's (n); the oracles' rounds cost nothing")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = measure(args)
    print_report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
