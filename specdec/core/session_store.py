"""A bounded map of per-session state: max sessions, max cached tokens, idle TTL, LRU eviction.

Both tiers keep state per generation session (token lists, KV caches) that the coordinator can
always rebuild by resending the context, so dropping a session is a cache miss, never an error.
That makes a plain LRU with hard bounds the right policy: memory stays bounded however many
coordinators die without ending their sessions.

Values may grow in place (a KV cache after a forward pass): the owner calls `resize(key)` to
have the new size counted. The entry being stored or resized is never evicted by its own call,
so the token bound can be exceeded by the one session in use when it alone is over budget, and
no `pinned` key is ever evicted (the sessions of the forward pass being built). `on_remove` sees
every value that leaves, however it leaves, so an owner can free what the value holds.
Thread-safe: the draft service touches it from the event loop and from the model's worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class EvictionCounts:
    lru: int = 0  # dropped to make room (max_sessions or max_tokens)
    ttl: int = 0  # idle longer than ttl_s
    pressure: int = 0  # dropped by `evict_one`: the owner ran out of something else (KV blocks)


class SessionStore(MutableMapping[str, V], Generic[V]):
    def __init__(
        self,
        max_sessions: int | None = None,  # None: unbounded
        max_tokens: int | None = None,  # bound on the sum of size(value); None: unbounded
        ttl_s: float | None = None,  # idle seconds before a session expires; None: never
        size: Callable[[V], int] = lambda value: 0,  # tokens a value holds
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_sessions is not None and max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self.ttl_s = ttl_s
        self._size = size
        self._clock = clock
        self._lock = threading.RLock()
        # key -> (value, its counted size, last use); order is least recently used first.
        self._entries: OrderedDict[str, tuple[V, int, float]] = OrderedDict()
        self._total = 0
        self.evicted = EvictionCounts()
        self.pinned: set[str] = set()
        self.on_remove: Callable[[V], None] | None = None

    @property
    def total_tokens(self) -> int:
        return self._total

    def __getitem__(self, key: str) -> V:
        """A lookup is a use: it renews the TTL and makes the session most recently used."""
        with self._lock:
            self._expire()
            value, size, _ = self._entries[key]
            self._entries[key] = (value, size, self._clock())
            self._entries.move_to_end(key)
            return value

    def __setitem__(self, key: str, value: V) -> None:
        with self._lock:
            self._expire()
            self._remove(key, notify=self.peek(key) is not value)  # storing the same value again frees nothing
            size = self._size(value)
            self._entries[key] = (value, size, self._clock())
            self._total += size
            self._evict_for(key)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            if key not in self._entries:
                raise KeyError(key)
            self._remove(key)

    def __contains__(self, key: object) -> bool:
        """Membership without counting as a use."""
        with self._lock:
            self._expire()
            return key in self._entries

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            self._expire()
            return iter(list(self._entries))

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    def peek(self, key: str) -> V | None:
        """The value without counting a use (no LRU or TTL renewal); None when absent."""
        with self._lock:
            self._expire()
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def resize(self, key: str) -> None:
        """Count the current size of a value that grew or shrank in place; evict others to fit.
        A key that is gone (evicted meanwhile) is left gone."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            value, old, last_use = entry
            new = self._size(value)
            self._entries[key] = (value, new, last_use)
            self._total += new - old
            self._evict_for(key)

    def has_room(self, key: str) -> bool:
        """Whether storing `key` keeps max_sessions: it is held already, the store is below the
        bound, or some session is not pinned (the LRU takes it)."""
        with self._lock:
            self._expire()
            if key in self._entries or self.max_sessions is None or len(self._entries) < self.max_sessions:
                return True
            return any(k not in self.pinned for k in self._entries)

    def evict_one(self) -> bool:
        """Drop the least recently used session that is not pinned; False when there is none."""
        with self._lock:
            victim = next((k for k in self._entries if k not in self.pinned), None)
            if victim is None:
                return False
            self._remove(victim)
            self.evicted.pressure += 1
            return True

    def _remove(self, key: str, notify: bool = True) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._total -= entry[1]
            if notify and self.on_remove is not None:
                self.on_remove(entry[0])

    def _expire(self) -> None:
        # Entries are in order of last use, so the expired ones are a prefix.
        if self.ttl_s is None:
            return
        oldest_kept = self._clock() - self.ttl_s
        for key, (_, _, last_use) in list(self._entries.items()):
            if last_use > oldest_kept:
                break
            if key not in self.pinned:
                self._remove(key)
                self.evicted.ttl += 1

    def _evict_for(self, keep: str) -> None:
        """Drop least recently used sessions (never `keep`) until both bounds hold."""

        def over() -> bool:
            too_many = self.max_sessions is not None and len(self._entries) > self.max_sessions
            too_big = self.max_tokens is not None and self._total > self.max_tokens
            return too_many or too_big

        while over():
            victim = next((k for k in self._entries if k != keep and k not in self.pinned), None)
            if victim is None:
                return
            self._remove(victim)
            self.evicted.lru += 1
