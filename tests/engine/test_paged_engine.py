"""The target engine: a ragged pass over the KV block pool gives what a plain forward gives,
blocks are bounded and freed, long prefills go in chunks beside decode rows, and a bad round
fails alone."""

from __future__ import annotations

import pytest
import torch

from specdec.core.acceptance import DraftProposal
from specdec.core.sampling import SamplingParams
from specdec.core.session_store import SessionStore
from specdec.runtime.kv_pool import BlockTable, KVBlockPool, KVShape
from specdec.runtime.projection import forward_logits
from specdec.runtime.ragged import Row, context_groups, ragged_forward, use_paged_attention
from specdec.target_service.scheduler import cached_tokens
from specdec.target_service.verifier import ItemRejected, TargetVerifier, VerifyItem

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.9, top_k=40, seed=11)
MiB = 1 << 20


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _plain(model, tokens: list[int], keep: int) -> torch.Tensor:
    """Logits of the last `keep` positions from one uncached forward over `tokens`."""
    return forward_logits(model, keep, input_ids=torch.tensor([tokens]), use_cache=False)[0]


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma3", "gemma2"])
@torch.inference_mode()
def test_a_ragged_pass_equals_plain_forwards(tiny, kind):
    """Prefills of 1-40 tokens (past Gemma 3's sliding window of 8), then verify rows of 1-3
    tokens, then a rollback into the middle of a block and a new row there: every kept logit
    equals an uncached forward over the whole sequence."""
    model = tiny(kind, 1).model
    use_paged_attention(model)
    pool = KVBlockPool(KVShape.of(model.config), 4 * MiB, block_size=4)
    contexts = [_ids(i, n) for i, n in enumerate((5, 23, 1, 40))]
    tables = [BlockTable() for _ in contexts]

    def run(news: list[list[int]], keeps: list[int]) -> None:
        rows = []
        for table, new, keep in zip(tables, news, keeps):
            pool.grow(table, table.length + len(new))
            rows.append(Row(table, new, keep))
        got = ragged_forward(model, pool, rows)
        for context, new in zip(contexts, news):
            context.extend(new)
        expected = torch.cat([_plain(model, c, keep) for c, keep in zip(contexts, keeps)])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

    prompts = [list(c) for c in contexts]
    for context in contexts:
        context.clear()
    run(prompts, [2, 2, 1, 2])
    run([[7], [8, 9, 10], [11, 12], [13]], [1, 3, 2, 1])
    pool.truncate(tables[1], 21)  # mid-block: positions 21.. are rewritten
    del contexts[1][21:]
    run([[14], [15, 16], [17], [18, 19, 20, 21]], [1, 2, 1, 4])


@torch.inference_mode()
def test_gemma2_soft_caps_attention_in_a_pass_as_transformers_eager_does(tiny, tiny_dir):
    """Gemma 2 loads (transformers serves it only with eager attention) and a ragged pass (a
    prefill past the window of 8 beside a short row, then decode rows) gives transformers' own
    eager logits; without the cap they differ, so the cap is what is compared."""
    from transformers import AutoModelForCausalLM

    model = tiny("gemma2", 1).model
    use_paged_attention(model)
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir("gemma2", 1), attn_implementation="eager").eval()
    pool = KVBlockPool(KVShape.of(model.config), 4 * MiB, block_size=4)
    contexts, tables = [_ids(5, 30), _ids(6, 5)], [BlockTable(), BlockTable()]

    def check(news: list[list[int]]) -> None:
        for table, new in zip(tables, news):
            pool.grow(table, table.length + len(new))
        got = ragged_forward(model, pool, [Row(t, new, 1) for t, new in zip(tables, news)])
        for context, new in zip(contexts, news):
            context.extend(new)
        expected = torch.cat([plain(input_ids=torch.tensor([c])).logits[0, -1:] for c in contexts])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

    prompts = [list(c) for c in contexts]
    for context in contexts:
        context.clear()
    check(prompts)
    check([[7], [8]])
    capped = plain(input_ids=torch.tensor([contexts[0]])).logits
    for module in plain.modules():
        if hasattr(module, "attn_logit_softcapping"):
            module.attn_logit_softcapping = None
    assert not torch.allclose(plain(input_ids=torch.tensor([contexts[0]])).logits, capped, atol=1e-2)


def test_short_rows_attend_in_groups_of_similar_context():
    """Each group pads its rows to its longest context: rows of 20 and 400 positions attend apart,
    rows of nearly one length together, and every row is in exactly one group."""

    def rows(*lengths: int, tokens: int = 1) -> list[Row]:
        return [Row(BlockTable(length=n), [0] * tokens, tokens) for n in lengths]

    assert context_groups(rows(400, 20, 410, 22)) == [[1, 3], [0, 2]]
    assert context_groups(rows(100, 101, 99, 102)) == [[2, 0, 1, 3]]
    assert context_groups(rows(7)) == [[0]] and context_groups([]) == []
    mixed = rows(*range(10, 1000, 37), tokens=5)
    groups = context_groups(mixed)
    assert sorted(i for g in groups for i in g) == list(range(len(mixed))) and 1 < len(groups) < len(mixed)


def test_blocks_are_taken_and_returned_whole():
    # Bytes for 11 blocks of 4 positions (2 layers x K and V x 4 dims x 4 bytes each): 10 usable
    # beside the null block, which padded attention reads and which is all zeros.
    pool = KVBlockPool(KVShape(layers=2, kv_heads=1, head_dim=4), budget_bytes=2 * 2 * 4 * 4 * 4 * 11, block_size=4)
    assert pool.num_blocks == 10 and pool.free_blocks == 10
    assert not pool.keys[0][:4].any() and not pool.values[1][:4].any()
    a, b = BlockTable(), BlockTable()
    pool.grow(a, 9)  # 3 blocks
    pool.grow(b, 4)  # 1 block
    assert pool.used_blocks == 4 and len(a.blocks) == 3 and 0 not in a.blocks + b.blocks
    assert pool.slots(a, 3, 6) == [a.blocks[0] * 4 + 3, a.blocks[1] * 4, a.blocks[1] * 4 + 1]
    pool.truncate(a, 5)  # positions 5..8 dropped: the third block is free again, the second kept
    assert pool.used_blocks == 3 and a.length == 5 and len(a.blocks) == 2
    with pytest.raises(Exception, match="blocks needed"):
        pool.grow(b, 4 + 4 * 9)
    assert pool.used_blocks == 3 and b.length == 4  # all or nothing
    pool.release(a)
    pool.release(b)
    assert pool.free_blocks == 10


def _items(round_: int, n: int = 8) -> list[VerifyItem]:
    items = []
    for i in range(n):
        sampling = GREEDY if i % 2 else SAMPLED
        drafts = _ids(100 + i + round_, i % 6)
        q = None
        if not sampling.greedy and i % 4 == 0 and drafts:
            q = torch.softmax(torch.randn(len(drafts), 259, generator=torch.Generator().manual_seed(i)), -1)
        items.append(VerifyItem(f"s{i}", _ids(i, 3 + 7 * i + round_), DraftProposal(drafts, q), sampling))
    return items


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_chunked_prefill_and_a_small_pool_change_no_result(tiny, kind):
    """A pass budget of 8 tokens (every prompt past the first goes in chunks) and a pool of a few
    blocks (sessions are preempted and re-prefilled) give the same rounds as a roomy verifier."""
    target = tiny(kind, 1)
    roomy = TargetVerifier(target, kv_cache_bytes=64 * MiB)
    per_token = KVShape.of(target.model.config).bytes_per_token(torch.float32)
    tight = TargetVerifier(target, kv_cache_bytes=per_token * 16 * 7, pass_tokens=8)
    assert tight.pool.num_blocks == 6  # 96 positions for 8 sessions of up to 56 tokens each
    for round_ in range(3):
        items = _items(round_)
        assert tight.verify_batch(items) == roomy.verify_batch(items)
        assert tight.pool.used_blocks <= tight.pool.num_blocks
    assert tight.sessions.evicted.pressure > 0  # blocks were short: sessions were preempted


def test_a_long_prefill_goes_in_chunks_beside_decode_rows(tiny):
    target = tiny("llama", 1)
    verifier = TargetVerifier(target, kv_cache_bytes=16 * MiB, pass_tokens=16)
    short = VerifyItem("short", _ids(1, 5), DraftProposal([7, 8]), GREEDY)
    long = VerifyItem("long", _ids(2, 60), DraftProposal([9]), GREEDY)
    first = verifier.step([short, long])
    assert short in first and long not in first  # a whole round, and the prompt's first chunk
    assert verifier.sessions["long"].table.length == 16 - 7  # what the short row left of the budget
    passes = 1
    while (result := verifier.step([long]).get(long)) is None:
        passes += 1
    assert passes == 4  # chunks to 25, 41 and 57 tokens, then the last 3 with the draft
    alone = TargetVerifier(target, kv_cache_bytes=16 * MiB)
    assert result == alone.verify(long.session_id, long.tokens, long.proposal, long.sampling)


def test_a_bad_round_fails_alone(tiny):
    target = tiny("llama", 1)
    per_token = KVShape.of(target.model.config).bytes_per_token(torch.float32)
    verifier = TargetVerifier(target, kv_cache_bytes=per_token * (64 + 16))  # 4 blocks and the null block
    good = _items(0, 3)
    bad = [
        VerifyItem("vocab", [1, 2, 10_000], DraftProposal([3]), GREEDY),
        VerifyItem("q", [1, 2], DraftProposal([3, 4], torch.full((1, 259), 1 / 259)), SAMPLED),
        VerifyItem("huge", list(range(3, 80)), DraftProposal([]), GREEDY),  # 77 > the pool's 64 positions
        VerifyItem("empty", [], DraftProposal([]), GREEDY),
    ]
    results = verifier.step(bad[:2] + good[:1] + bad[2:] + good[1:])
    assert all(isinstance(results[item], ItemRejected) for item in bad)
    assert "10000" not in str(results[bad[0]]) and "outside [0, 259)" in str(results[bad[0]])
    assert "KV pool of 64 positions" in str(results[bad[2]])
    fresh = TargetVerifier(target, kv_cache_bytes=16 * MiB)
    assert [results[item] for item in good] == fresh.verify_batch(good)


def test_sessions_of_the_pass_are_never_evicted(tiny):
    """max_sessions 2 and four rounds at once: the pass takes two, the others wait (no round
    loses its session mid-pass), and every round still gets its answer."""
    target = tiny("llama", 1)
    store = SessionStore(max_sessions=2, size=cached_tokens)
    verifier = TargetVerifier(target, store, kv_cache_bytes=16 * MiB)
    items = _items(0, 4)
    first = verifier.step(items)
    assert len(first) == 2 and len(store) == 2
    assert verifier.verify_batch(items) == TargetVerifier(target, kv_cache_bytes=16 * MiB).verify_batch(items)
    assert len(store) <= 2


def test_many_long_sessions_stay_within_the_budget(tiny):
    """256 sessions of 1,000 tokens against a pool for about 40 of them: blocks in use never pass
    the pool, sessions beyond it wait or are re-prefilled, and none fails."""
    target = tiny("llama", 1)
    per_token = KVShape.of(target.model.config).bytes_per_token(torch.float32)
    verifier = TargetVerifier(target, kv_cache_bytes=per_token * 40 * 1008, pass_tokens=2048)
    contexts = [_ids(i, 1000) for i in range(256)]
    peak = 0
    for round_ in range(2):
        items = [VerifyItem(f"s{i}", c + [round_], DraftProposal([5, 6]), GREEDY) for i, c in enumerate(contexts)]
        pending = items
        while pending:
            results = verifier.step(pending)
            peak = max(peak, verifier.pool.used_blocks)
            assert not any(isinstance(r, Exception) for r in results.values())
            pending = [item for item in pending if item not in results]
    assert peak <= verifier.pool.num_blocks == 40 * 1008 // 16 - 1
    assert verifier.sessions.evicted.pressure > 0
