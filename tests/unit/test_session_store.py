"""SessionStore: LRU order, idle TTL on an injected clock, the token budget, in-place growth."""

from __future__ import annotations

import pytest

from specdec.core.session_store import SessionStore


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lru_evicts_the_least_recently_used():
    store = SessionStore(max_sessions=2)
    store["a"], store["b"] = 1, 2
    assert store["a"] == 1  # a lookup is a use: b is now the oldest
    store["c"] = 3
    assert set(store) == {"a", "c"} and "b" not in store
    assert store.evicted.lru == 1
    assert store.get("b") is None  # eviction is a miss, not an error
    assert "a" in store and store.peek("a") == 1  # membership and peek are not uses ...
    store["d"] = 4
    assert set(store) == {"c", "d"}  # ... so a, the least recently *used*, went next


def test_ttl_expires_idle_sessions_and_use_renews_it():
    clock = Clock()
    store = SessionStore(ttl_s=10.0, clock=clock)
    store["idle"], store["busy"] = "x", "y"
    clock.now += 6
    assert store["busy"] == "y"
    clock.now += 6  # idle: 12 s since its last use; busy: 6 s
    assert "idle" not in store and store["busy"] == "y"
    assert len(store) == 1 and store.evicted.ttl == 1
    clock.now += 10
    with pytest.raises(KeyError):
        store["busy"]
    assert len(store) == 0 and store.total_tokens == 0


def test_token_budget_evicts_by_size_and_keeps_the_session_in_use():
    store = SessionStore(max_tokens=10, size=len)
    store["a"], store["b"] = [0] * 4, [0] * 4
    assert store.total_tokens == 8
    store["c"] = [0] * 4  # 12 > 10: the oldest goes
    assert set(store) == {"b", "c"} and store.total_tokens == 8
    store["b"] = [0] * 2  # replacing a value recounts it
    assert store.total_tokens == 6
    store["huge"] = [0] * 50  # over budget on its own: everyone else goes, it stays
    assert set(store) == {"huge"} and store.total_tokens == 50


def test_resize_counts_growth_in_place():
    store = SessionStore(max_tokens=10, size=len)
    store["a"], store["b"] = [0] * 3, [0] * 3
    store["b"].extend([0] * 5)  # the owner grew it (a KV cache after a forward)
    assert store.total_tokens == 6  # not yet counted
    store.resize("b")
    assert set(store) == {"b"} and store.total_tokens == 8
    store.resize("gone")  # a key evicted meanwhile stays gone
    assert "gone" not in store


def test_delete_pop_and_bounds_validation():
    store = SessionStore(max_sessions=4, size=len)
    store["a"] = [1, 2]
    assert store.pop("a") == [1, 2] and store.total_tokens == 0
    assert store.pop("a", None) is None
    with pytest.raises(KeyError):
        del store["a"]
    for bad in ({"max_sessions": 0}, {"max_tokens": -1}, {"ttl_s": 0}):
        with pytest.raises(ValueError):
            SessionStore(**bad)


def test_pinned_sessions_are_never_evicted_and_removals_are_seen():
    removed = []
    store = SessionStore(max_sessions=2, size=len)
    store.on_remove = removed.append
    store["a"], store["b"] = [1], [2]
    store.pinned = {"a", "b"}
    assert not store.has_room("c") and store.has_room("a")  # full of pinned sessions
    assert not store.evict_one()
    store.pinned = {"b"}
    assert store.has_room("c")
    assert store.evict_one() and removed == [[1]] and store.evicted.pressure == 1
    value = store["b"]
    store["b"] = value  # storing the same value again frees nothing
    assert removed == [[1]]
    store["b"] = [3]  # a new value: the old one is gone
    del store["b"]
    assert removed == [[1], [2], [3]]
