"""The target model as a verifier over a paged KV pool (no networking here).

The verifier runs the pass the scheduler plans (`target_service/scheduler.py`: admission, the
token budget, chunked prefill, pinning, preemption) and owns what happens from the forward on:
one ragged forward over the plan's rows (`specdec.runtime.ragged`), the shared acceptance rule on
the rows that decide their round, and the rollback. One forward over [new context tokens,
x_1..x_k] gives the target's logits at the k+1 positions that decide a round; the acceptance
rule picks the tokens; the session is cut back to the committed prefix plus the accepted drafts
(the final target token is not cached yet: it is fed at the start of the next round, as the
drafter does), which frees whole blocks. A token tree keeps the accepted path only.

Guarantees: per-item results equal one-at-a-time results whatever the batch, the budget or the
pool size (same logits up to fp32 rounding, same keyed draws), so batching changes speed, never
text. Every tensor of the pass lives on the model's device and the acceptance decisions of all
rows are read back in one host sync: a sync per row would stall the device once per session.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from specdec.core.acceptance import (
    DraftProposal,
    PassCost,
    Verification,
    greedy_decisions,
    resolve_greedy,
    resolve_sampled,
    resolve_tree,
    sampled_decisions,
    tree_decisions,
)
from specdec.core.sampling import SamplingParams, warp
from specdec.core.session_store import SessionStore
from specdec.runtime.compiled import compile_decoder
from specdec.runtime.greedy_head import GreedyHead
from specdec.runtime.kv_pool import PagedSession
from specdec.runtime.models import LoadedModel
from specdec.runtime.projection import final_softcap, head_logits, splits
from specdec.runtime.ragged import Row, paged_pool, ragged_forward, ragged_hidden
from specdec.target_service.scheduler import (
    DEFAULT_PASS_TOKENS,
    ItemRejected,
    PassPlan,
    ScheduledRow,
    Scheduler,
    VerifyItem,
)

# Pass lengths the verifier profiles before serving (`profile_passes`): one request's rounds up to
# 16 positions, then batches of them.
PROFILED_POSITIONS = (1, 2, 3, 5, 9, 17, 32, 64, 128)

# What one pass settles, by the round it belongs to (absent: the round needs another pass).
PassResults = dict[VerifyItem, Verification | Exception]

# The verifier's interface: callers build VerifyItems and meet ItemRejected in step's results.
__all__ = ["DEFAULT_PASS_TOKENS", "ItemRejected", "PassResults", "TargetVerifier", "VerifyItem"]


class TargetVerifier:
    def __init__(
        self,
        loaded: LoadedModel,
        sessions: SessionStore[PagedSession] | None = None,
        kv_cache_bytes: int | None = None,
        pass_tokens: int = DEFAULT_PASS_TOKENS,
        compile_mode: str = "off",
    ):
        self.loaded = loaded
        self.pool = paged_pool(loaded.model, kv_cache_bytes)
        # Decode-shaped passes through a compiled decoder (`--compile`), compiled here, before the
        # first round: a first pass that paid the compilation would read as a slow verify.
        self.decoder = compile_decoder(loaded.model, compile_mode, loaded.model.config._attn_implementation)
        if self.decoder is not None:
            self._warm_up()
        # Greedy passes find the argmax through a bf16 screen of the output projection (exact:
        # specdec.runtime.greedy_head); a final softcap could tie logits the screen tells apart.
        model, head = loaded.model, loaded.model.get_output_embeddings()
        screens = splits(model) and final_softcap(model) is None and GreedyHead.supported(head)
        self.greedy_head = GreedyHead(head) if screens else None
        # Elsewhere greedy passes reduce the fp32 product (capped, under a final softcap) to its
        # argmax slice by slice (`projection.VOCAB_SLICE`), never holding the kept rows' whole logits.
        self.sliced_argmax = splits(model) and hasattr(head, "argmax")
        self.scheduler = Scheduler(
            self.pool,
            sessions,
            pass_tokens,
            vocab_in=loaded.model.get_input_embeddings().num_embeddings,
            vocab_size=loaded.vocab_size,
            max_context=loaded.max_context,
        )
        self.sessions = self.scheduler.sessions  # the scheduler's store: callers read and end sessions here

    def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
        return self.verify_batch([VerifyItem(session_id, tokens, proposal, sampling)])[0]

    def verify_batch(self, items: Sequence[VerifyItem]) -> list[Verification]:
        """Verify the rounds of several sessions, in as few passes as the budgets allow; per-item
        results equal one-at-a-time results (same logits up to fp32 rounding, same keyed draws).
        Returned in the order of `items`; the first item that fails raises."""
        results: dict[VerifyItem, Verification | Exception] = {}
        pending = list(items)
        while pending:
            results.update(self.step(pending))
            pending = [item for item in pending if item not in results]
        for item in items:
            if isinstance(results[item], Exception):
                raise results[item]
        return [results[item] for item in items]  # type: ignore[misc]

    @torch.inference_mode()
    def step(self, items: Sequence[VerifyItem]) -> PassResults:
        """One forward pass over as much of `items` as fits. Per item this pass settles: its
        Verification, or the exception that fails it alone. An item absent needs another pass (a
        chunk of its prefill went in, or it waits for blocks, budget or a session slot)."""
        results: PassResults = {}
        with self.scheduler.schedule(items) as plan:
            results.update(plan.rejected)
            if plan.rows:
                started = time.perf_counter()
                self._decide(plan.deciding, self._forward(plan), results)
                # A pass of whole rounds only is what a round costs; a prefill chunk in it is not.
                if all(r.decides and len(r.row.tokens) == r.row.keep for r in plan.rows):
                    cost = PassCost(len(plan.rows), plan.tokens, time.perf_counter() - started)
                    for scheduled in plan.rows:
                        results[scheduled.item].cost = cost
        return results

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """Compile the decoder's pieces: one pass of 1 token (torch specialises T = 1) and one of
        2 (every other T), in blocks returned at once."""
        for length in (1, 2):
            session = PagedSession()
            self.pool.extend(session, [0] * length)
            try:
                ragged_forward(self.loaded.model, self.pool, [Row(session.table, session.tokens, 1)], self.decoder)
            finally:
                self.pool.release(session.table)

    def end_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    @torch.inference_mode()
    def profile_passes(
        self, positions: Sequence[int] = PROFILED_POSITIONS, context: int = 32, repeats: int = 3
    ) -> dict[int, float]:
        """Seconds of a decode-shaped pass by the positions it computes (the median of `repeats`),
        measured before any round: the coordinator's draft-length policy starts from them rather
        than from a guessed slope, which on a CPU would price drafts far above their cost until
        rounds of every length had measured it (`CostModel.seed_passes`). Up to 16 positions are
        one row (one request's k + 1), more are rows of 16 (many requests' rounds in one pass);
        rows attend to a `context`-token prefix of their own. Blocks are returned at the end."""
        pool = self.pool
        seconds: dict[int, float] = {}
        for total in positions:
            lengths = [16] * (total // 16) + ([total % 16] if total % 16 else [])
            if total + len(lengths) * context > pool.capacity_tokens // 2:
                break  # a small pool (tests): profile what fits, the policy extrapolates the rest
            sessions = [PagedSession() for _ in lengths]
            try:
                for session in sessions:  # prefixes with real keys and values
                    pool.extend(session, [0] * context)
                self._pass([Row(session.table, session.tokens, 1) for session in sessions], greedy=True)
                samples = []
                for _ in range(repeats):
                    for session, n in zip(sessions, lengths):
                        pool.extend(session, [0] * n)
                    rows = [Row(session.table, [0] * n, n) for session, n in zip(sessions, lengths)]
                    started = time.perf_counter()
                    out = self._pass(rows, greedy=True)  # a greedy round's pass, to its host sync
                    (out if out.dim() == 1 else greedy_decisions(out)).tolist()
                    samples.append(time.perf_counter() - started)
                    for session in sessions:
                        pool.cut(session, context)
                seconds[total] = statistics.median(samples)
            finally:
                for session in sessions:
                    pool.release(session.table)
        return seconds

    def _forward(self, plan: PassPlan) -> torch.Tensor:
        """The pass over the plan's rows (`_pass`), greedy when every deciding row is."""
        return self._pass(plan.batch, greedy=all(r.item.sampling.greedy for r in plan.deciding))

    def _pass(self, rows: list[Row], greedy: bool) -> torch.Tensor:
        """The logits of the kept positions, (kept, vocab), or, when `greedy` and the head screens
        (`GreedyHead`) or is reduced slice by slice (`sliced_argmax`), just their argmax, (kept,)."""
        model = self.loaded.model
        if not greedy or (self.greedy_head is None and not self.sliced_argmax):
            return ragged_forward(model, self.pool, rows, self.decoder)
        hidden = ragged_hidden(model, self.pool, rows, self.decoder)  # (kept, d)
        if self.greedy_head is not None:
            return self.greedy_head.argmax(hidden, lambda h: head_logits(model, h))
        argmax = model.get_output_embeddings().argmax(hidden, final_softcap(model))
        return argmax if argmax is not None else greedy_decisions(head_logits(model, hidden))

    def _decide(self, deciding: list[ScheduledRow], out: torch.Tensor, results: PassResults) -> None:
        """Acceptance for every deciding row on the device, one host sync, then the rollbacks.
        `out`: what `_forward` gave, logits or (all rows greedy) the argmax already."""
        decisions, start = [], 0
        # Greedy rows share one argmax over every kept position (one kernel, not one a row).
        argmax = out if out.dim() == 1 else greedy_decisions(out)
        for scheduled in deciding:
            item = scheduled.item
            k = len(item.proposal.token_ids)
            rows = out[start : start + k + 1]  # (k+1, vocab) when any row samples
            if item.sampling.greedy:
                decisions.append(argmax[start : start + k + 1])  # a tree's walk takes the argmax at each node too
            elif scheduled.row.parents is not None:  # a tree that is not a chain
                probs = warp(rows, item.sampling)
                decisions.append(tree_decisions(probs, item.proposal, item.sampling.seed, len(item.tokens)))
            else:
                probs = warp(rows, item.sampling)  # (k+1, vocab)
                proposal = DraftProposal(
                    item.proposal.token_ids, _match_vocab(item.proposal.draft_probs, probs.shape[-1])
                )
                decisions.append(sampled_decisions(probs, proposal, item.sampling.seed, len(item.tokens)))
            start += k + 1
        values = _to_host(torch.cat(decisions)) if decisions else []  # the pass's one host sync
        start = 0
        for scheduled, decided in zip(deciding, decisions):
            item, session = scheduled.item, scheduled.session
            mine, start = values[start : start + len(decided)], start + len(decided)
            if scheduled.row.parents is not None:
                result = resolve_tree(mine, item.proposal)
                # Only the accepted path's keys and values stay, moved to consecutive positions.
                self.pool.keep_path(session, session.table.length - len(item.proposal.token_ids), result.path)
            else:
                result = (
                    resolve_greedy(mine, list(item.proposal.token_ids))
                    if item.sampling.greedy
                    else resolve_sampled(mine, item.proposal)
                )
                rejected = len(item.proposal.token_ids) - result.num_accepted
                self.pool.cut(session, session.table.length - rejected)
            self.sessions.resize(item.session_id)  # count its size now; evict others to fit
            results[scheduled.item] = result


def _to_host(decisions: torch.Tensor) -> list[int]:
    return decisions.tolist()


def _match_vocab(q: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """A draft sharing the tokenizer may have fewer output rows (padding differs): pad q with 0."""
    if q is None or q.shape[-1] == vocab:
        return q
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
