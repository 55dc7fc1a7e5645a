"""A KV block pool: every layer's keys and values in storage allocated once, handed out in blocks.

Storage per layer is (num_blocks * block_size, kv_heads, head_dim) for keys and again for values,
sized from a byte budget when the pool is made. A session owns a block table (the blocks that
hold its positions, in order): position p lives in slot `blocks[p // block_size] * block_size +
p % block_size`. Growing a session takes blocks from the free list; rolling it back shortens its
length and returns whole blocks no position uses any more; ending it returns them all. No tensor
is ever copied to grow, shrink or batch a session: a forward pass writes its new states into
their slots and reads every session's states through its slots (`specdec.runtime.ragged`).

Every layer keeps every position, sliding-window layers included: the mask bounds what they
read, so rolling back past a window is exact and never needs a re-prefill, at the cost of memory
a window-sized ring would save.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig

BLOCK_SIZE = 16  # positions per block (vLLM's default too)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share: what a session keeps of a new context."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than a growth needs."""


@dataclass
class BlockTable:
    """The blocks holding one session's positions, and how many positions they hold."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


@dataclass
class PagedSession:
    """A block table and exactly the tokens whose positions it holds."""

    table: BlockTable = field(default_factory=BlockTable)
    tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> KVShape:
        config = config.get_text_config()
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(config.num_hidden_layers, kv_heads, head_dim)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype.itemsize


class KVBlockPool:
    def __init__(
        self,
        shape: KVShape,
        budget_bytes: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        block_size: int = BLOCK_SIZE,
    ):
        self.shape, self.dtype, self.device, self.block_size = shape, dtype, torch.device(device), block_size
        # Block 0 is the null block, zeroed and never handed out: attention's padded key slots read
        # it. Storage is torch.empty, and stale bits there could be NaN, which a mask's -inf does
        # not cancel (NaN - inf is NaN) and would spread over the whole row.
        self.num_blocks = budget_bytes // (shape.bytes_per_token(dtype) * block_size) - 1  # usable
        if self.num_blocks < 1:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no block of {block_size} positions "
                f"({shape.bytes_per_token(dtype)} bytes each) beside the null block"
            )
        slots = (self.num_blocks + 1) * block_size
        # torch.empty: on a CPU, pages are committed as blocks are first written.
        self.keys = [self._storage(slots) for _ in range(shape.layers)]
        self.values = [self._storage(slots) for _ in range(shape.layers)]
        for storage in self.keys + self.values:
            storage[:block_size].zero_()
        self._free = list(range(self.num_blocks, 0, -1))  # a stack: low blocks handed out first
        # The engine's thread grows and cuts tables while another may end a session (an actor's
        # event loop, a TTL expiry during a metrics scrape): the free list changes under a lock.
        self._lock = threading.Lock()

    def _storage(self, slots: int) -> torch.Tensor:
        return torch.empty(slots, self.shape.kv_heads, self.shape.head_dim, dtype=self.dtype, device=self.device)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_needed(self, table: BlockTable, new_length: int) -> int:
        """Blocks a growth of `table` to `new_length` positions takes from the free list."""
        return max(0, -(-new_length // self.block_size) - len(table.blocks))

    def grow(self, table: BlockTable, new_length: int) -> None:
        """Give `table` the blocks for `new_length` positions; all or nothing."""
        with self._lock:
            needed = self.blocks_needed(table, new_length)
            if needed > len(self._free):
                raise OutOfBlocks(f"{needed} blocks needed, {len(self._free)} free")
            for _ in range(needed):
                table.blocks.append(self._free.pop())
            table.length = max(table.length, new_length)

    def truncate(self, table: BlockTable, new_length: int) -> None:
        """Keep the first `new_length` positions; blocks past them go back to the free list."""
        if not 0 <= new_length <= table.length:
            raise ValueError(f"cannot truncate {table.length} positions to {new_length}")
        keep = -(-new_length // self.block_size)
        with self._lock:
            self._free.extend(reversed(table.blocks[keep:]))
            del table.blocks[keep:]
            table.length = new_length

    def release(self, table: BlockTable) -> None:
        self.truncate(table, 0)

    def resume(self, session: PagedSession, tokens: Sequence[int]) -> None:
        """Cut `session` back to what it shares with `tokens`, leaving out at least the last token
        (its logits are the ones the caller needs)."""
        self.cut(session, min(common_prefix(session.tokens, tokens), len(tokens) - 1))

    def extend(self, session: PagedSession, tokens: Sequence[int]) -> None:
        """Give `session` the blocks for `tokens` more positions and count them; all or nothing
        (OutOfBlocks)."""
        self.grow(session.table, session.table.length + len(tokens))
        session.tokens.extend(tokens)

    def cut(self, session: PagedSession, length: int) -> None:
        """Keep the session's first `length` positions and tokens."""
        self.truncate(session.table, length)
        del session.tokens[length:]

    def keep_path(self, session: PagedSession, first: int, path: Sequence[int]) -> None:
        """Of the positions from `first` on (a token tree's nodes), keep those at first + path[j]
        as first + j (the accepted path, root to leaf), keys and values alike, and cut the rest."""
        moves = [(first + i, first + j) for j, i in enumerate(path) if i != j]
        if moves:
            src = torch.tensor([self.slots(session.table, a, a + 1)[0] for a, _ in moves], device=self.device)
            dst = torch.tensor([self.slots(session.table, b, b + 1)[0] for _, b in moves], device=self.device)
            for storage in self.keys + self.values:
                storage.index_copy_(0, dst, storage.index_select(0, src))  # gathered before written
            for a, b in moves:
                session.tokens[b] = session.tokens[a]
        self.cut(session, first + len(path))

    def slots(self, table: BlockTable, start: int, end: int) -> list[int]:
        """The storage slots of positions start..end-1 of `table`."""
        size, blocks = self.block_size, table.blocks
        return [blocks[p // size] * size + p % size for p in range(start, end)]


def default_budget(device: torch.device) -> int:
    """The KV budget when none is given: 90% of the GPU memory less what is in use after the
    weights (as vLLM's gpu_memory_utilization), or on a CPU a quarter of the memory available
    now (several actors and the weights' packed copies share a node's RAM), within the
    container's memory limit when it has one."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return max(0, int(0.9 * total) - (total - free))
    return _available_ram() // 4


def _available_ram() -> int:
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:  # cgroup v2: a pod's limit, which the host's free memory says nothing about
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
    except (OSError, ValueError):
        return available
    return available if limit == "max" else min(available, max(0, int(limit) - used))
