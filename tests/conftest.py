"""Shared fixtures: tiny random models saved with save_pretrained and loaded by our own loader."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach a hub

from tiny import make_tiny_model  # noqa: E402

from specdec.runtime.loading import load_model  # noqa: E402
from specdec.runtime.models import LoadedModel  # noqa: E402

TINY_KINDS = ("llama", "gpt2", "gemma3", "gemma2")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """kind, seed -> directory of a saved tiny model (built once per session)."""
    root = tmp_path_factory.mktemp("tiny")
    built: dict[tuple[str, int], str] = {}

    def get(kind: str, seed: int = 0):
        if (kind, seed) not in built:
            built[(kind, seed)] = str(make_tiny_model(kind, root / f"{kind}-{seed}", seed=seed, sliding_window=8))
        return built[(kind, seed)]

    return get


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    """kind, seed -> LoadedModel, loaded once per session."""
    loaded: dict[tuple[str, int], LoadedModel] = {}

    def get(kind: str, seed: int = 0) -> LoadedModel:
        if (kind, seed) not in loaded:
            loaded[(kind, seed)] = load_model(tiny_dir(kind, seed))
        return loaded[(kind, seed)]

    return get


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray per test session (2 CPUs, token auth with a per-session token)."""
    import ray

    from specdec.target_service.ray_cluster import connect

    connect(None, namespace="specdec-test", num_cpus=2)
    yield ray
    ray.shutdown()
