"""Joining or starting a Ray cluster, with authentication set up on purpose.

Recent Ray turns token authentication on for new local clusters and writes a token under the
home directory. We keep that protection but decide the token ourselves: the one given in
RAY_AUTH_TOKEN (how a Kubernetes Secret reaches the pods), or a fresh random one for a local
cluster, held in this process's environment so that the workers it starts inherit it and
nothing is left on disk.
"""

from __future__ import annotations

import os
import secrets

import ray


def connect(address: str | None, namespace: str, num_cpus: int | None = None) -> None:
    """Join the cluster at `address` (its auth settings come from the environment, as Ray reads
    them), or start a local one with token authentication and a token of our own."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
        return
    # ray.init turns token mode on for a new local cluster unless RAY_AUTH_MODE says otherwise
    # (it must be set before ray is imported to take effect); our token is the one it finds.
    if os.environ.get("RAY_AUTH_MODE", "token") == "token":
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray.init(num_cpus=num_cpus, namespace=namespace, include_dashboard=False, log_to_driver=False)
