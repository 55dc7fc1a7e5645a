"""Which drafter should answer a round: prompt lookups and the draft model compared offline.

Greedy acceptance needs no target pass per round: a draft token is accepted iff it is the next
token of the target's own greedy continuation, so one continuation per prompt is the ground truth.
The draft's teacher-forced argmax and confidence at every position stand in for its drafts (its
j-th token is judged only when the j-1 before it were right, i.e. on the true context, which is
where teacher forcing gives the very token it would draft). Each order of sources is walked round
by round as the hybrid drafter would (draft_service/hybrid.py), and priced with a cost model in
target steps: a round verifies 1 + drafted positions at 1 + verify_cost * drafted, and each model
token costs draft_cost (one more step when its confidence stop ends the draft early). The
hybrid's order (long match, short match, model) is chosen by this comparison (bench/README.md,
"Hybrid order").

    python -m specdec.bench.hybrid_order            # embedded target, shipped draft, free prompts
    python -m specdec.bench.hybrid_order --tokens 128 --k 4
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.bench.prompts import FREE_CODE_PROMPTS, FREE_PROSE_PROMPTS
from specdec.draft_service.hybrid import HybridConfig
from specdec.draft_service.ngram import NgramConfig, NgramDrafter

ORDERS = {  # name: the sources tried in turn, the first that proposes anything answers
    "ngram": ("ngram",),
    "long>short": ("long", "short"),
    "long>model>short": ("long", "model", "short"),  # the model ahead of short matches
    "long>short>model": ("long", "short", "model"),  # the hybrid's order (draft_service/hybrid.py)
    "model": ("model",),
}


@dataclass
class Case:
    prompt: list[int]
    continuation: list[int]  # the target's greedy tokens
    draft_argmax: list[int]  # at position i: the draft's token for position i + 1 of prompt + continuation
    draft_confidence: list[float]


@dataclass
class Outcome:
    speedup: float  # tokens over cost, in target steps (1.0 = target-only)
    first_token: dict[str, tuple[int, int]] = field(default_factory=dict)  # source: (first token right, rounds)


def cases(target, draft, prompts: Sequence[str], tokens: int) -> list[Case]:
    """The target's greedy continuation of each prompt and the draft's view of it."""
    out = []
    for prompt in prompts:
        ids = target.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            full = target.model.generate(ids, max_new_tokens=tokens, do_sample=False)
            probs = draft.model(full).logits[0].float().softmax(-1)  # (len, vocab)
        confidence, argmax = probs.max(-1)
        out.append(Case(ids[0].tolist(), full[0, ids.shape[1] :].tolist(), argmax.tolist(), confidence.tolist()))
    return out


def walk(
    case_list: Sequence[Case],
    order: Sequence[str],
    k: int,
    model_k: int,
    min_confidence: float,
    verify_cost: float,
    draft_cost: float,
) -> Outcome:
    """Greedy rounds of `order` over every case; speedup and first-token acceptance per source."""
    config = HybridConfig()
    lookups: dict[str, Callable[[list[int], int], list[int]]] = {
        "ngram": NgramDrafter().propose,
        "long": NgramDrafter(NgramConfig(config.max_match, config.min_match)).propose,
        "short": NgramDrafter(NgramConfig(config.min_match - 1, 1)).propose,
    }
    outcome, tokens, cost = Outcome(0.0), 0, 0.0
    for case in case_list:
        context, done = list(case.prompt), 0
        while done < len(case.continuation):
            room = min(k, len(case.continuation) - done - 1)  # the last token is always the target's own
            proposal, source, spent = [], None, 0.0
            for name in order if room > 0 else ():
                if name == "model":
                    proposal = _model_draft(case, len(context) - 1, min(room, model_k), min_confidence)
                    spent = draft_cost * (len(proposal) + (len(proposal) < min(room, model_k)))
                else:
                    proposal = lookups[name](context, room)
                if proposal:
                    source = name
                    break
            accepted = 0
            while accepted < len(proposal) and proposal[accepted] == case.continuation[done + accepted]:
                accepted += 1
            if source is not None:
                right, rounds = outcome.first_token.get(source, (0, 0))
                outcome.first_token[source] = (right + (accepted > 0), rounds + 1)
            step = accepted + 1
            context += case.continuation[done : done + step]
            done += step
            tokens += step
            cost += 1 + verify_cost * len(proposal) + spent
    outcome.speedup = tokens / cost
    return outcome


def _model_draft(case: Case, last: int, k: int, min_confidence: float) -> list[int]:
    """The draft's greedy tokens after position `last`, up to k, stopping before its first unsure
    token. Past its first wrong token nothing is judged (-1 stands for the tokens it would still
    draft there: they cost their steps and verify positions, and are never accepted)."""
    sequence = case.prompt + case.continuation
    out: list[int] = []
    for i in range(last, last + k):
        if case.draft_confidence[i] < min_confidence:
            break
        out.append(case.draft_argmax[i])
        if case.draft_argmax[i] != sequence[i + 1]:
            return out + [-1] * (k - len(out))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    from specdec.drafts import loading as draft_loading
    from specdec.runtime.loading import load_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-model", default=None, help="default: the embedded Gemma 3 270M")
    parser.add_argument("--draft-model", default="distilled", help="default: the shipped distilled draft")
    parser.add_argument(
        "--tokens", type=int, default=64, help="greedy tokens per prompt (default 64, as the benchmark)"
    )
    parser.add_argument("--k", type=int, default=2, help="draft tokens per round (default 2)")
    parser.add_argument("--model-k", type=int, default=1, help="the model's cap within k (default 1)")
    parser.add_argument(
        "--min-confidence",
        type=float,
        default=0.3,
        help="the model's confidence stop (default 0.3, the shipped draft's)",
    )
    parser.add_argument(
        "--verify-cost",
        type=float,
        default=0.15,
        help="target steps per extra verified position "
        "(default 0.15, the cost without oneDNN's packed kernels; about 0.03 with them)",
    )
    parser.add_argument(
        "--draft-cost", type=float, default=0.11, help="target steps per model draft token (default 0.11)"
    )
    args = parser.parse_args(argv)
    target, draft = load_model(args.target_model), draft_loading.load_model(args.draft_model)
    prompts = [prompt for _, prompt in FREE_PROSE_PROMPTS + FREE_CODE_PROMPTS]
    case_list = cases(target, draft, prompts, args.tokens)
    print(f"{len(case_list)} free prompts x {args.tokens} greedy tokens, k = {args.k}, model k = {args.model_k}")
    print(f"{'order':18} {'speedup':>8}  first token right / rounds, per source")
    for name, order in ORDERS.items():
        outcome = walk(case_list, order, args.k, args.model_k, args.min_confidence, args.verify_cost, args.draft_cost)
        per_source = "  ".join(f"{s} {r / n:.2f} ({n})" for s, (r, n) in outcome.first_token.items())
        print(f"{name:18} {outcome.speedup:7.3f}x  {per_source}")


if __name__ == "__main__":
    main()
