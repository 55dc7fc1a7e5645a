"""`specdec coordinator --ray-join` and `specdec target --ray-join`: the process joins the Ray
cluster as a node of its own (no CPUs, no GPUs: nothing is scheduled there) and works as a
driver there, never as a Ray Client of the head. The session's Ray here has no client server at
all, so a coordinator that serves through it can only be calling the actors directly, and a
keeper that creates a pool through it can only be a driver."""

from __future__ import annotations

import subprocess
import sys

import pytest
import ray
from stackkit import NAMESPACE, REQUESTS, CoordinatorProcess, Stack, assert_same_output, run_streams, until

from specdec.coordinator.engine import EngineConfig


@pytest.fixture(scope="module")
def stack(fault_tiers):
    s = Stack(fault_tiers, EngineConfig(draft_retry_s=0.25))
    yield s
    s.close()


def _alive() -> dict[str, dict]:
    return {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}


@pytest.mark.long  # a coordinator process starts (Ray node, torch, tokenizer): about 30 s
def test_a_coordinator_joined_as_a_ray_node_serves_as_a_driver_and_its_node_leaves_with_it(stack, fault_expected):
    before = _alive()
    gcs = ray.get_runtime_context().gcs_address
    coordinator = CoordinatorProcess(stack.tiers.draft.address, stack.tiers.pool_name, ["--ray-join", gcs])
    try:
        joined = {node_id: node for node_id, node in _alive().items() if node_id not in before}
        assert len(joined) == 1, joined
        ((node_id, node),) = joined.items()
        assert node["Resources"].get("CPU", 0) == 0 and node["Resources"].get("GPU", 0) == 0
        assert_same_output(run_streams(coordinator.address, REQUESTS), fault_expected)
    finally:
        coordinator.stop()
    until(lambda: node_id not in _alive(), 30, "the coordinator's node left the cluster")
    stack.assert_clean()


@pytest.mark.long  # the keeper process starts (Ray node, torch) and creates an actor: about 30 s
def test_the_pool_keeper_joined_as_a_ray_node_creates_the_pool_and_its_node_leaves_with_it(tiny_dir):
    before = _alive()
    gcs = ray.get_runtime_context().gcs_address
    prefix = "specdec-joined-keeper"
    argv = ["target", "--ray-join", gcs, "--replicas", "1", "--name", prefix, "--namespace", NAMESPACE,
            "--target-model", tiny_dir("llama", 1), "--metrics-host", "127.0.0.1", "--metrics-port", "0"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "specdec.cli.app", *argv], capture_output=True, text=True, timeout=240
    )  # no --keep: it creates the pool and returns, leaving the detached actor behind
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"target pool {prefix} in namespace {NAMESPACE}: {prefix}-0" in done.stdout, done.stdout
    actor = ray.get_actor(f"{prefix}-0", namespace=NAMESPACE)
    try:
        assert ray.get(actor.info.remote(), timeout=60)["model"]
    finally:
        ray.kill(actor, no_restart=True)
    until(lambda: set(_alive()) <= set(before), 30, "the keeper's node left the cluster")
