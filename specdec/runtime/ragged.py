"""One forward pass over a packed ragged batch, with attention reading K/V from the block pool.

A pass packs every row's new tokens into one sequence of T tokens (decode rows, verify rows of
k+1 tokens, prefill chunks, side by side, no padding), with each token's real position as its
position id. The model runs once over it: every projection and MLP sees T rows, and the weights
are read once. Only attention needs to know where rows begin and end; it runs as a registered
transformers attention function (`specdec_paged`) that, per layer:

1. writes the pass's new keys and values into their pool slots (one `index_copy_` each);
2. reads each row's keys and values through its slots (one `index_select` per group of rows);
3. attends with a mask that lets a token see its own row's positions up to its own (and, in a
   sliding-window layer, only the last `window` of them).

Rows are grouped so attention does not pad a short row to a prefill's length: rows of at most
`_SHORT` new tokens (decode and verify) share batched attentions, each group padded to the
longest context among its rows and formed of rows of similar context (`context_groups`); each
longer row (a prefill chunk) attends alone. Padded keys read the pool's
null block (zeros) and are masked; padded query rows see key 0 only, so no softmax row is empty.

A model switched to `specdec_paged` still runs normally (SDPA with transformers' masks) when a
forward carries no pass layout: the draft tier, references in tests and HF `generate` share it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

from specdec.core import tree
from specdec.runtime.compiled import Decoder
from specdec.runtime.kv_pool import BlockTable, KVBlockPool, KVShape, default_budget
from specdec.runtime.paged_decoder import paged_decoder
from specdec.runtime.projection import forward_hidden, forward_logits

IMPLEMENTATION = "specdec_paged"
# Models that soft-cap attention logits (Gemma 2): SDPA cannot, so forwards without a pass
# layout run the model's own eager attention, on the additive masks it expects.
SOFTCAP_IMPLEMENTATION = "specdec_paged_softcap"
_SHORT = 16  # rows with at most this many new tokens attend together
# A group's fixed cost and a gathered key's, in units of one query attending to one key
# (`context_groups`; the per-key and per-group times behind them: docs/performance.md).
_GATHER_QUERIES = 5
_GROUP_COST = 600


@dataclass
class Row:
    """One session's part of a pass: `tokens` go at positions table.length - len(tokens) ...
    (the caller has grown the table), and the logits of the last `keep` are wanted."""

    table: BlockTable
    tokens: Sequence[int]
    keep: int
    # The last len(parents) tokens are a token tree's nodes (`specdec.core.tree`), the token
    # before them its root: each node sits at the root's position + its depth and attends to the
    # context and its own ancestors only. None: every token attends causally.
    parents: Sequence[int] | None = None


@dataclass
class _Group:
    """Rows that attend together: queries gathered from the packed sequence into (B, N) and keys
    gathered from the pool into (B, C), both padded."""

    query_index: torch.Tensor  # (B * N,) packed index of each padded query (pads: 0)
    slots: torch.Tensor  # (B * C,) pool slot of each padded key (pads: slot 0, in the null block)
    query_pos: torch.Tensor  # (B, N, 1) position of each query (pads: 0)
    key_len: torch.Tensor  # (B, 1, 1) positions each row holds after this pass
    valid: torch.Tensor  # (M,) flat (B * N) index of each real query, in packed order
    packed: torch.Tensor  # (M,) its packed index
    rows: int
    queries: int  # N
    keys: int  # C
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # window -> (B, 1, N, C)
    # With a tree row in the group: which keys each query sees, and each key's position (a tree
    # node's is not its slot index). None: causal by position, which is the slot index.
    visible: torch.Tensor | None = None  # (B, N, C)
    key_positions: torch.Tensor | None = None  # (B, 1, C)

    def mask(self, window: int | None) -> torch.Tensor:
        if window not in self.masks:
            if self.visible is None:
                key_pos = torch.arange(self.keys, device=self.query_pos.device)  # (C,)
                seen = (key_pos <= self.query_pos) & (key_pos < self.key_len)  # (B, N, C)
            else:
                key_pos, seen = self.key_positions, self.visible.clone()
            if window is not None:
                seen &= key_pos > self.query_pos - window
            self.masks[window] = seen.unsqueeze(1)
        return self.masks[window]


@dataclass
class PassLayout:
    pool: KVBlockPool
    new_slots: torch.Tensor  # (T,) where each packed token's keys and values go
    groups: list[_Group]
    tokens: int  # T
    # (T,) each token's row's largest position in the pass + 1: the sequence length a per-sequence
    # rule (Phi-3's longrope) sees for the row.
    reach: torch.Tensor | None = None

    def attend(
        self,
        layer: int,
        query: torch.Tensor,  # (T, H, d)
        key: torch.Tensor,  # (T, Hkv, d): the new positions only
        value: torch.Tensor,
        scaling: float | None,
        window: int | None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Layer `layer`'s attention for the pass: the new keys and values written to their pool
        slots, then each group's queries over its rows' keys, their logits soft-capped at
        `softcap` when given. Returns (T, H, d). Transformers' modules reach it through
        `paged_attention`, the paged decoder directly."""
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        keys.index_copy_(0, self.new_slots, key.to(keys.dtype))
        values.index_copy_(0, self.new_slots, value.to(values.dtype))
        heads, dim, kv_heads = query.shape[1], query.shape[-1], keys.shape[1]
        out = query.new_empty(self.tokens, heads, dim)
        for group in self.groups:
            b, n, c = group.rows, group.queries, group.keys
            q = query.index_select(0, group.query_index).view(b, n, heads, dim).transpose(1, 2)
            k = keys.index_select(0, group.slots).view(b, c, kv_heads, dim).transpose(1, 2)
            v = values.index_select(0, group.slots).view(b, c, kv_heads, dim).transpose(1, 2)
            if softcap is None:
                attended = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=group.mask(window), scale=scaling, enable_gqa=heads != kv_heads
                )  # (b, H, n, d)
            else:
                attended = softcapped_attention(q, k, v, group.mask(window), scaling, softcap)
            attended = attended.transpose(1, 2).reshape(b * n, heads, dim)
            out.index_copy_(0, group.packed, attended.index_select(0, group.valid))
        return out


def ragged_forward(
    model: PreTrainedModel, pool: KVBlockPool, rows: Sequence[Row], decoder: Decoder | None = None
) -> torch.Tensor:
    """Run `rows` through the model in one pass, writing their states into the pool. Returns the
    logits of every row's kept positions, concatenated in row order: (sum of keep, vocab).
    `decoder`: a compiled twin of the model's decoder, run when the pass is decode-shaped; other
    passes run the model's paged decoder (`specdec.runtime.paged_decoder`) where one serves it,
    else transformers' modules."""
    keep, decoder, inputs = _pass(model, pool, rows, decoder)
    return forward_logits(model, keep, decoder, **inputs)[0]


def ragged_hidden(
    model: PreTrainedModel, pool: KVBlockPool, rows: Sequence[Row], decoder: Decoder | None = None
) -> torch.Tensor:
    """`ragged_forward` up to the output projection, for a model that `projection.splits`: the
    final hidden states of the kept positions, (sum of keep, d)."""
    keep, decoder, inputs = _pass(model, pool, rows, decoder)
    return forward_hidden(model, keep, decoder, **inputs)[0]


def _pass(model: PreTrainedModel, pool: KVBlockPool, rows: Sequence[Row], decoder: Decoder | None):
    """(kept positions, decoder, inputs) of one pass over `rows`, for `forward_logits` and kin."""
    device = pool.device
    ids, positions, new_slots, kept, reach = [], [], [], [], []
    for row in rows:
        start = row.table.length - len(row.tokens)
        kept.extend(range(len(ids) + len(row.tokens) - row.keep, len(ids) + len(row.tokens)))
        ids.extend(row.tokens)
        row_positions = _positions(row)
        positions.extend(row_positions)
        reach.extend([max(row_positions) + 1] * len(row_positions))
        new_slots.extend(pool.slots(row.table, start, row.table.length))
    layout = PassLayout(pool, _tensor(new_slots, device), _groups(pool, rows), len(ids), _tensor(reach, device))
    inputs = dict(
        input_ids=_tensor(ids, device).unsqueeze(0),
        position_ids=_tensor(positions, device).unsqueeze(0),
        # A 4D mask is taken as given by transformers' mask builders, so they build none.
        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device),
        use_cache=False,
        specdec_pass=layout,
    )
    if decoder is None or not decode_shaped(rows):
        decoder = paged_decoder(model)  # None: transformers' modules
    return _tensor(kept, device), decoder, inputs


def decode_shaped(rows: Sequence[Row]) -> bool:
    """Every row is a decode or verify row (none a prefill chunk): the passes `--compile` serves."""
    return all(len(row.tokens) <= _SHORT for row in rows)


def _positions(row: Row) -> list[int]:
    """The position of each of the row's new tokens: its slot index in the table, except a tree
    node's, which is the root's + the node's depth."""
    start = row.table.length - len(row.tokens)
    if row.parents is None:
        return list(range(start, row.table.length))
    first = row.table.length - len(row.parents)  # node 0's slot index; the root's is first - 1
    return list(range(start, first)) + [first - 1 + d for d in tree.depths(row.parents)]


def _tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def _groups(pool: KVBlockPool, rows: Sequence[Row]) -> list[_Group]:
    offsets, total = [], 0
    for row in rows:
        offsets.append(total)
        total += len(row.tokens)
    short = [i for i, row in enumerate(rows) if len(row.tokens) <= _SHORT]
    by_context = [[short[i] for i in part] for part in context_groups([rows[i] for i in short])]
    members = by_context + [[i] for i, row in enumerate(rows) if len(row.tokens) > _SHORT]
    return [_group(pool, [rows[i] for i in m], [offsets[i] for i in m]) for m in members]


def context_groups(rows: Sequence[Row]) -> list[list[int]]:
    """Short rows (indexes into `rows`) split into groups of similar context length.

    A group gathers every row's keys padded to its longest context and attends to all of them,
    so one group over contexts of 30 and 300 positions reads 300 keys for both rows. Splitting
    costs a group's fixed work (its gathers and attention call, per layer). With rows sorted by
    context, the cheapest split into consecutive runs is a shortest path over split points:
    cost(group) = _GROUP_COST + rows * longest context * (queries + _GATHER_QUERIES), the
    gather of a key and its attention by each padded query (docs/performance.md)."""
    if not rows:
        return []
    order = sorted(range(len(rows)), key=lambda i: rows[i].table.length)
    lengths = [rows[i].table.length for i in order]
    queries = [len(rows[i].tokens) for i in order]
    best = [0.0] + [float("inf")] * len(order)  # best[j]: the cheapest split of order[:j]
    start = [0] * (len(order) + 1)  # where the last group of that split begins
    for j in range(1, len(order) + 1):
        widest = 0
        for i in range(j - 1, -1, -1):  # the group order[i:j], its longest context lengths[j - 1]
            widest = max(widest, queries[i])
            cost = best[i] + _GROUP_COST + (j - i) * lengths[j - 1] * (widest + _GATHER_QUERIES)
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(order[start[j] : j])
        j = start[j]
    return groups[::-1]


def _group(pool: KVBlockPool, rows: list[Row], offsets: list[int]) -> _Group:
    n_max = max(len(row.tokens) for row in rows)
    c_max = max(row.table.length for row in rows)
    query_index, query_pos, slots, valid, packed = [], [], [], [], []
    for b, (row, offset) in enumerate(zip(rows, offsets)):
        n, length = len(row.tokens), row.table.length
        query_index += list(range(offset, offset + n)) + [0] * (n_max - n)
        query_pos += _positions(row) + [0] * (n_max - n)
        slots += pool.slots(row.table, 0, length) + [0] * (c_max - length)
        valid += range(b * n_max, b * n_max + n)
        packed += range(offset, offset + n)
    device = pool.device
    visible = key_positions = None
    if any(row.parents is not None for row in rows):
        pairs = [_tree_visibility(row, n_max, c_max) for row in rows]
        visible = torch.stack([v for v, _ in pairs]).to(device)
        key_positions = torch.stack([k for _, k in pairs]).unsqueeze(1).to(device)
    return _Group(
        visible=visible,
        key_positions=key_positions,
        query_index=_tensor(query_index, device),
        slots=_tensor(slots, device),
        query_pos=_tensor(query_pos, device).view(len(rows), n_max, 1),
        key_len=_tensor([row.table.length for row in rows], device).view(len(rows), 1, 1),
        valid=_tensor(valid, device),
        packed=_tensor(packed, device),
        rows=len(rows),
        queries=n_max,
        keys=c_max,
    )


def _tree_visibility(row: Row, queries: int, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries, keys) which keys each of the row's (padded) queries sees, and (keys,) each key's
    position: causal over the context; a tree node sees the context and its ancestors."""
    n, length = len(row.tokens), row.table.length
    slot = torch.arange(keys)
    own = torch.arange(length - n, length)  # each query's slot index
    visible = torch.zeros(queries, keys, dtype=torch.bool)
    visible[:n] = (slot <= own.unsqueeze(1)) & (slot < length)
    visible[n:, 0] = True  # a padded query sees key 0 only: no softmax row is empty
    key_pos = slot.clone()
    if row.parents is not None:
        t = len(row.parents)
        first = length - t
        nodes = torch.zeros(t, t, dtype=torch.bool)
        for i, ancestors in enumerate(tree.ancestry(row.parents)):
            nodes[i, list(ancestors)] = True
        visible[n - t : n, first:length] = nodes
        key_pos[first:length] = first - 1 + torch.tensor(tree.depths(row.parents))
    return visible, key_pos


def softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float | None, softcap: float
) -> torch.Tensor:
    """Attention with logits capped at softcap * tanh(logits / softcap), as transformers' eager
    attention computes it (Gemma 2): q (b, H, n, d), k and v (b, Hkv, c, d), mask (b, 1, n, c)
    True where a query sees a key. Returns (b, H, n, d). The query heads that share a key head
    are stacked into one product with it, (H / Hkv) n queries a row, rather than the keys and
    values copied per head; the cap and the mask are applied in place."""
    b, heads, n, d = q.shape
    kv_heads = k.shape[1]
    logits = torch.matmul(q.reshape(b, kv_heads, heads // kv_heads * n, d), k.transpose(2, 3))
    logits.mul_(d**-0.5 if scaling is None else scaling).div_(softcap).tanh_().mul_(softcap)
    by_head = logits.view(b, kv_heads, heads // kv_heads, n, -1).masked_fill_(~mask.unsqueeze(2), float("-inf"))
    probs = torch.softmax(by_head.view_as(logits), dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).view(b, heads, n, d)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, T, d)
    key: torch.Tensor,  # (1, Hkv, T, d): the new positions only
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    specdec_pass: PassLayout | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if specdec_pass is None:
        if softcap is not None:  # the model's own eager attention (its module defines one)
            eager = sys.modules[type(module).__module__].eager_attention_forward
            return eager(module, query, key, value, attention_mask, scaling=scaling, softcap=softcap, **kwargs)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, sliding_window=sliding_window, **kwargs
        )
    query, key, value = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, heads, d)
    attended = specdec_pass.attend(module.layer_idx, query, key, value, scaling, sliding_window, softcap)
    return attended.unsqueeze(0), None  # (1, T, H, d), as transformers' attention functions return


AttentionInterface.register(IMPLEMENTATION, paged_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)
AttentionInterface.register(SOFTCAP_IMPLEMENTATION, paged_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(SOFTCAP_IMPLEMENTATION, eager_mask)


def use_paged_attention(model: PreTrainedModel) -> None:
    """Switch `model` to paged attention: `specdec_paged`, which behaves as SDPA in forwards
    without a pass layout, or for a model that soft-caps attention logits `specdec_paged_softcap`,
    which behaves as the model's eager attention there."""
    softcap = getattr(model.config.get_text_config(), "attn_logit_softcapping", None)
    model.set_attn_implementation(SOFTCAP_IMPLEMENTATION if softcap else IMPLEMENTATION)


def paged_pool(model: PreTrainedModel, kv_cache_bytes: int | None) -> KVBlockPool:
    """`model` switched to paged attention (and its paged decoder made, where one serves it), and
    a block pool for it on its device and dtype: `kv_cache_bytes`, or `default_budget` for that
    device when None."""
    use_paged_attention(model)
    paged_decoder(model)
    weight = next(model.parameters())
    budget = kv_cache_bytes if kv_cache_bytes is not None else default_budget(weight.device)
    return KVBlockPool(KVShape.of(model.config), budget, weight.dtype, weight.device)
