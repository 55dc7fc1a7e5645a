"""Paged attention kernels on one device: the engine's gather (one indexed read of the pool per
group of rows, then SDPA) against FlexAttention reading the pool in place through a block mask.

  python -m specdec.bench.paged_attention [--device cuda] [--repeats 20] [--json PATH]

One attention layer of the embedded Gemma 3 270M's shape (4 query heads, 1 KV head, head dim 256
by default) over a KV block pool whose blocks are handed out in a shuffled order, as after a
while of serving. Per case (rows x context x new tokens a row):

- gather: `specdec.runtime.ragged.paged_attention` on the pass layout the engine builds (it also
  writes the pass's new keys and values into the pool);
- flex: `flex_attention` compiled, over the whole pool as one key sequence, with a mask that lets
  a query see the slots its own row holds up to its own position; the block mask is built per
  pass from the block tables (`flex`, the engine's cost) and once (`flex kernel`, the kernel alone).

Both give the same output (checked, max abs difference printed). Cases run in turn within each
repeat; tables show medians. bench/gpu_check.sh runs it on a GPU; docs/performance.md has the CPU's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from specdec.runtime.kv_pool import KVBlockPool, KVShape, PagedSession
from specdec.runtime.ragged import PassLayout, Row, _groups, paged_attention

CASES = ((1, 256, 1), (16, 256, 1), (16, 256, 5), (64, 256, 1), (16, 1024, 5))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Case:
    def __init__(self, args, rows: int, context: int, new: int, device: torch.device):
        shape = KVShape(1, args.kv_heads, args.head_dim)
        per_row = -(-context // 16)
        budget = shape.bytes_per_token(torch.float32) * 16 * (rows * per_row + 8)
        self.pool = KVBlockPool(shape, budget, torch.float32, device)
        g = torch.Generator().manual_seed(rows * 7919 + context)
        self.pool._free = [self.pool._free[i] for i in torch.randperm(len(self.pool._free), generator=g).tolist()]
        for layer in (self.pool.keys[0], self.pool.values[0]):
            layer.copy_(torch.randn(layer.shape, generator=g).to(device))
            layer[: self.pool.block_size].zero_()  # the null block stays zeros
        sessions = [PagedSession() for _ in range(rows)]
        for session in sessions:
            self.pool.extend(session, [0] * context)
        self.rows = [Row(s.table, s.tokens[context - new :], new) for s in sessions]
        tokens = rows * new
        self.query = torch.randn(1, args.heads, tokens, args.head_dim, generator=g).to(device)
        self.key = torch.randn(1, args.kv_heads, tokens, args.head_dim, generator=g).to(device)
        self.value = torch.randn(1, args.kv_heads, tokens, args.head_dim, generator=g).to(device)
        new_slots = [slot for row in self.rows for slot in self.pool.slots(row.table, context - new, context)]
        self.new_slots = torch.tensor(new_slots, device=device)
        self.layout = PassLayout(self.pool, self.new_slots, _groups(self.pool, self.rows), tokens)
        self.module = SimpleNamespace(layer_idx=0)
        self.scale = args.head_dim**-0.5
        self.device, self.context, self.new = device, context, new
        self.mask = self.block_mask()

    def gather(self) -> torch.Tensor:
        out, _ = paged_attention(
            self.module, self.query, self.key, self.value, None, scaling=self.scale, specdec_pass=self.layout
        )
        return out[0]  # (T, H, d)

    def block_mask(self):
        """Which slot each query may see, from the block tables: its own row's, up to its position."""
        slots = self.pool.keys[0].shape[0]
        owner = torch.full((slots,), -1, dtype=torch.int64)
        position = torch.zeros(slots, dtype=torch.int64)
        for r, row in enumerate(self.rows):
            mine = torch.tensor(self.pool.slots(row.table, 0, self.context))
            owner[mine] = r
            position[mine] = torch.arange(self.context)
        owner, position = owner.to(self.device), position.to(self.device)
        query_row = torch.arange(len(self.rows), device=self.device).repeat_interleave(self.new)
        query_pos = torch.arange(self.context - self.new, self.context, device=self.device).repeat(len(self.rows))

        def visible(b, h, q, kv):
            return (owner[kv] == query_row[q]) & (position[kv] <= query_pos[q])

        return create_block_mask(visible, 1, None, len(query_row), slots, device=self.device)

    def flex(self, mask) -> torch.Tensor:
        keys, values = self.pool.keys[0], self.pool.values[0]
        keys.index_copy_(0, self.new_slots, self.key[0].transpose(0, 1))
        values.index_copy_(0, self.new_slots, self.value[0].transpose(0, 1))
        out = _FLEX(
            self.query,
            keys.permute(1, 0, 2).unsqueeze(0),
            values.permute(1, 0, 2).unsqueeze(0),
            block_mask=mask,
            scale=self.scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)  # (T, H, d)


_FLEX = torch.compile(flex_attention, dynamic=False)


def run(args) -> dict:
    device = torch.device(args.device)
    cases = {f"{rows}x{context}x{new}": Case(args, rows, context, new, device) for rows, context, new in args.cases}
    arms = {
        "gather": lambda c: c.gather(),
        "flex": lambda c: c.flex(c.block_mask()),
        "flex kernel": lambda c: c.flex(c.mask),
    }
    diffs = {}
    with torch.inference_mode():
        for name, case in cases.items():
            diffs[name] = (case.gather() - case.flex(case.mask)).abs().max().item()
            for arm in arms.values():
                arm(case)  # compile, warm
        times = {name: {arm: [] for arm in arms} for name in cases}
        for _ in range(args.repeats):
            for name, case in cases.items():
                for arm, call in arms.items():
                    _sync(device)
                    started = time.perf_counter()
                    call(case)
                    _sync(device)
                    times[name][arm].append(1000 * (time.perf_counter() - started))
    return {
        "device": str(device),
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim},
        "ms": {name: {arm: statistics.median(ms) for arm, ms in by_arm.items()} for name, by_arm in times.items()},
        "max_abs_diff": diffs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.paged_attention", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--cases",
        default=",".join("x".join(map(str, case)) for case in CASES),
        help="rows x context x new tokens a row, comma separated (default: %(default)s)",
    )
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    args.cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    result = run(args)
    print(f"one attention layer on {result['device']}, ms a pass (median of {args.repeats}); rows x context x new")
    print(f"{'case':>12} {'gather':>9} {'flex':>9} {'flex kernel':>12} {'max diff':>9}")
    for name, ms in result["ms"].items():
        diff = result["max_abs_diff"][name]
        print(f"{name:>12} {ms['gather']:9.2f} {ms['flex']:9.2f} {ms['flex kernel']:12.2f} {diff:9.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(d < 1e-3 for d in result["max_abs_diff"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
