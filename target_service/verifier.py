"""The target model as a verifier over a paged KV pool (no networking here).

One forward pass over [new context tokens, x_1..x_k] gives the target's logits at the k+1
positions that decide a round; the shared acceptance rule picks the tokens; the session is cut
back to the committed prefix plus the accepted drafts (the final target token is not cached yet:
it is fed at the start of the next round, as the drafter does), which frees whole blocks.

`step` is one pass of the engine: the rounds it is given share one ragged forward
(`specdec.runtime.ragged`), under a budget of new tokens per pass. A round whose new tokens do
not fit is prefilled in chunks over several passes (so one long prompt never stalls the decode
rows beside it), and a round whose blocks cannot be found even after preempting every session
outside the pass waits for a later one. Sessions of the pass are pinned: neither the LRU nor a
preemption takes them. A preempted session's next round is a miss the pool resends.

Every tensor of the pass lives on the model's device; the acceptance decisions of all rows are
read back in one host sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.core import tree
from specdec.core.acceptance import (
    DraftProposal,
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
from specdec.runtime.ragged import IMPLEMENTATION, Row, paged_pool, ragged_forward, ragged_hidden

DEFAULT_PASS_TOKENS = 256  # new tokens per pass: a prefill beyond it goes in chunks


@dataclass
class VerifyItem:
    session_id: str
    tokens: Sequence[int]  # the committed sequence (prompt + generated)
    proposal: DraftProposal  # k drafts to check (k may be 0)
    sampling: SamplingParams


class ItemRejected(ValueError):
    """A round this verifier can never serve (its context exceeds the pool): fails that call only."""


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
        self.pass_tokens = pass_tokens
        # Decode-shaped passes through a compiled decoder (`--compile`), compiled here, before the
        # first round: a first pass that paid the compilation would read as a slow verify.
        self.decoder = compile_decoder(loaded.model, compile_mode, IMPLEMENTATION)
        if self.decoder is not None:
            self._warm_up()
        self._vocab_in = loaded.model.get_input_embeddings().num_embeddings
        # Greedy passes find the argmax through a bf16 screen of the output projection (exact:
        # specdec.runtime.greedy_head); a final softcap could tie logits the screen tells apart.
        model, head = loaded.model, loaded.model.get_output_embeddings()
        screens = splits(model) and final_softcap(model) is None and GreedyHead.supported(head)
        self.greedy_head = GreedyHead(head) if screens else None
        # Unbounded unless the owner passes a bounded store (the actor does: LRU, TTL, tokens).
        self.sessions = sessions if sessions is not None else SessionStore(size=cached_tokens)
        self.sessions.on_remove = lambda session: self.pool.release(session.table)

    def verify(
        self, session_id: str, tokens: Sequence[int], proposal: DraftProposal, sampling: SamplingParams
    ) -> Verification:
        return self.verify_batch([VerifyItem(session_id, tokens, proposal, sampling)])[0]

    def verify_batch(self, items: Sequence[VerifyItem]) -> list[Verification]:
        """Verify the rounds of several sessions, in as few passes as the budgets allow; per-item
        results equal one-at-a-time results (same logits up to fp32 rounding, same keyed draws)."""
        results: list[Verification | Exception | None] = [None] * len(items)
        pending = list(range(len(items)))
        while pending:
            for i, result in zip(pending, self.step([items[i] for i in pending])):
                results[i] = result
            pending = [i for i in pending if results[i] is None]
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def step(self, items: Sequence[VerifyItem]) -> list[Verification | Exception | None]:
        """One forward pass over as much of `items` as fits. Per item: its Verification, the
        exception that fails it alone, or None when it needs another pass (a chunk of its
        prefill went in, or it waits for blocks)."""
        results: list[Verification | Exception | None] = [None] * len(items)
        rows: list[Row] = []
        finals: list[tuple[int, PagedSession]] = []  # rows that decide their round
        budget = self.pass_tokens
        self.sessions.pinned = {item.session_id for item in items}
        try:
            in_pass: set[str] = set()
            # Whole rounds first (decode and verify rows), then prefill chunks in what is left:
            # a long prompt never takes the budget from the rows beside it.
            for chunks in (False, True):
                for i, item in enumerate(items):
                    if budget <= 0:
                        break
                    if results[i] is not None or item.session_id in in_pass:
                        continue  # done, rejected, or a second round of a session in the pass
                    try:
                        row = self._plan(item, budget, chunks, first=chunks and not rows)
                    except ItemRejected as error:
                        results[i] = error
                        continue
                    if row is None:
                        continue
                    session, new, final = row
                    in_pass.add(item.session_id)
                    parents = _tree_of(item.proposal) if final else None
                    rows.append(Row(session.table, new, len(item.proposal.token_ids) + 1 if final else 0, parents))
                    if final:
                        finals.append((i, session))
                    budget -= len(new)
            if rows:
                self._decide(items, finals, self._forward(rows, items, finals), results)
        finally:
            self.sessions.pinned = set()
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

    def _plan(
        self, item: VerifyItem, budget: int, chunks: bool, first: bool
    ) -> tuple[PagedSession, list[int], bool] | None:
        """This pass's row for `item`: its session, the tokens it feeds, whether it decides the
        round (else it is a prefill chunk, when `chunks`); None when it must wait."""
        context, drafts = list(item.tokens), list(item.proposal.token_ids)
        if not context:
            raise ItemRejected("a round needs at least one committed token")
        if len(context) + len(drafts) > self.pool.capacity_tokens:
            raise ItemRejected(
                f"{len(context)} tokens plus {len(drafts)} drafts exceed the KV pool of "
                f"{self.pool.capacity_tokens} positions (--kv-cache-bytes)"
            )
        q = item.proposal.draft_probs
        if q is not None and (q.dim() != 2 or q.shape[0] != len(drafts) or q.shape[1] > self.loaded.vocab_size):
            raise ItemRejected(f"draft_probs of shape {tuple(q.shape)} for {len(drafts)} drafts")
        if item.proposal.parents is not None:
            try:
                tree.check(item.proposal.parents, len(drafts))
            except ValueError as error:
                raise ItemRejected(str(error)) from None
            if q is not None and not tree.is_chain(item.proposal.parents):
                raise ItemRejected("model drafts (with draft_probs) verify as chains, not trees")
        if not self.sessions.has_room(item.session_id):
            return None  # every session held is in this pass: a new one waits for the next
        session = self._resume(item.session_id, context)
        rest = context[session.table.length :] + drafts
        if min(rest) < 0 or max(rest) >= self._vocab_in:
            raise ItemRejected(f"a token id outside [0, {self._vocab_in})")
        if len(rest) <= budget or first and len(rest) - len(drafts) <= 1:
            new, final = rest, True  # the first row always goes, so every pass makes progress
        elif not chunks:
            return None
        else:
            new, final = context[session.table.length :][: min(budget, len(context) - 1 - session.table.length)], False
            if not new:
                return None
        if not self._reserve(session, new):
            return None
        return session, new, final

    def _resume(self, session_id: str, context: list[int]) -> PagedSession:
        """The session cut back to what it shares with `context`, leaving out at least the last
        token (its logits are the ones the round needs). An unknown session starts empty."""
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = PagedSession()
        self.pool.resume(session, context)
        return session

    def _reserve(self, session: PagedSession, new: list[int]) -> bool:
        """Extend the session by `new`, preempting sessions outside the pass (least recently
        used first) while blocks are short; False when that is not enough."""
        while self.pool.blocks_needed(session.table, session.table.length + len(new)) > self.pool.free_blocks:
            if not self.sessions.evict_one():
                return False
        self.pool.extend(session, new)
        return True

    def _forward(self, rows: list[Row], items, finals) -> torch.Tensor:
        """The pass: the logits of the kept positions, (kept, vocab), or, when every deciding row
        is greedy and the head screens (`GreedyHead`), just their argmax, (kept,)."""
        model = self.loaded.model
        if self.greedy_head is None or not all(items[i].sampling.greedy for i, _ in finals):
            return ragged_forward(model, self.pool, rows, self.decoder)
        hidden = ragged_hidden(model, self.pool, rows, self.decoder)  # (kept, d)
        return self.greedy_head.argmax(hidden, lambda h: head_logits(model, h))

    def _decide(self, items, finals, out: torch.Tensor, results) -> None:
        """Acceptance for every deciding row on the device, one host sync, then the rollbacks.
        `out`: what `_forward` gave, logits or (all rows greedy) the argmax already."""
        decisions, start = [], 0
        # Greedy rows share one argmax over every kept position (one kernel, not one a row).
        argmax = out if out.dim() == 1 else greedy_decisions(out)
        for i, _ in finals:
            item = items[i]
            k = len(item.proposal.token_ids)
            rows = out[start : start + k + 1]  # (k+1, vocab) when any row samples
            if item.sampling.greedy:
                decisions.append(argmax[start : start + k + 1])  # a tree's walk takes the argmax at each node too
            elif _tree_of(item.proposal) is not None:
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
        for (i, session), decided in zip(finals, decisions):
            item = items[i]
            mine, start = values[start : start + len(decided)], start + len(decided)
            if _tree_of(item.proposal) is not None:
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
            results[i] = result


def _tree_of(proposal: DraftProposal) -> list[int] | None:
    """The proposal's parents when it is a tree that is not a chain (a chain verifies as one)."""
    parents = proposal.parents
    return None if parents is None or tree.is_chain(parents) else list(parents)


def _to_host(decisions: torch.Tensor) -> list[int]:
    return decisions.tolist()


def cached_tokens(session: PagedSession) -> int:
    return len(session.tokens)


def _match_vocab(q: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """A draft sharing the tokenizer may have fewer output rows (padding differs): pad q with 0."""
    if q is None or q.shape[-1] == vocab:
        return q
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))
