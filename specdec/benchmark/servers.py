"""Starting and stopping the servers `specdec bench --peer vllm` compares (serving.py).

Ours is `specdec up` in a process group of its own; vLLM's OpenAI server runs from the Python of
its own venv (`--peer-python`), on a directory holding the same converted checkpoint and its
tokenizer. Both get the same KV budget. A server is ready when `/v1/models` answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_READY_TIMEOUT_S = 900.0  # vLLM's first start compiles its graphs: minutes on 2 cores


@dataclass
class Server:
    """An OpenAI-compatible server: its URL, the model name it serves, what each request adds."""

    url: str
    model: str
    extra: dict = field(default_factory=dict)
    process: subprocess.Popen | None = None  # None: started elsewhere (`--peer-url`)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_directory(target_model: str | None, work: Path) -> Path:
    """A directory vLLM can load: the target's own when it is one; for the embedded model (or a
    GGUF), the converted checkpoint with its tokenizer saved beside it (linked, not copied)."""
    from specdec.runtime.models import cache_dir, load_checkpoint_tokenizer

    if target_model and Path(target_model).is_dir():
        return Path(target_model)
    from specdec.runtime.loading import load_model

    load_model(target_model)  # converts and caches the checkpoint once, as `specdec demo` does
    converted = _converted(cache_dir() / "models", target_model)
    out = work / "peer-model"
    out.mkdir(parents=True, exist_ok=True)
    for f in converted.iterdir():
        link = out / f.name
        if not link.exists():
            link.symlink_to(f)
    load_checkpoint_tokenizer(target_model).save_pretrained(out)
    return out


def _converted(models: Path, target_model: str | None) -> Path:
    """The cache directory holding the converted checkpoint of `target_model` (newest first)."""
    stem = Path(target_model).stem.lower() if target_model else "gemma-3-270m"
    dirs = sorted((d for d in models.iterdir() if d.name.startswith(stem)), key=lambda d: -d.stat().st_mtime)
    if not dirs:
        raise SystemExit(f"no converted checkpoint for {target_model or 'the embedded model'} under {models}")
    return dirs[0]


def start_specdec(target_model: str | None, kv_bytes: str, log: Path, flags: Sequence[str] = ()) -> Server:
    """`specdec up` serving HTTP on a free port; `flags` go to it besides (`--itl-slo-ms 230`)."""
    port = free_port()
    cmd = [sys.executable, "-m", "specdec.cli.app", "up", "--port", "0", "--http-port", str(port)]
    cmd += ["--metrics-port", "0", "--trace-file", "", "--kv-cache-bytes", kv_bytes]
    cmd += ["--target-model", target_model] if target_model else []
    cmd += list(flags)
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return Server(f"http://127.0.0.1:{port}", "", process=process)


def start_vllm(python: str, model_dir: Path, kv_gib: int, log: Path, ngram: int = 0) -> Server:
    port = free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--dtype", "float32"]
    cmd += ["--port", str(port), "--host", "127.0.0.1", "--served-model-name", "peer"]
    if ngram:
        config = {"method": "ngram", "num_speculative_tokens": ngram, "prompt_lookup_max": 4}
        cmd += ["--speculative-config", json.dumps(config)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_gib))
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return Server(f"http://127.0.0.1:{port}", "peer", process=process)


async def wait_ready(server: Server, name: str, log: Path) -> None:
    """Poll /v1/models until the server answers; learn the model name it serves."""
    import httpx2

    deadline = time.monotonic() + _READY_TIMEOUT_S
    async with httpx2.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            if server.process is not None and server.process.poll() is not None:
                raise SystemExit(f"{name} exited with status {server.process.returncode}; its log: {log}")
            try:
                models = (await http.get(server.url + "/v1/models")).json()["data"]
                server.model = server.model or models[0]["id"]
                return
            except Exception:
                await asyncio.sleep(1.0)
    raise SystemExit(f"{name} did not answer within {_READY_TIMEOUT_S:.0f} s; its log: {log}")


def stop(server: Server) -> None:
    if server.process is None or server.process.poll() is not None:
        return
    os.killpg(server.process.pid, signal.SIGINT)  # SIGINT: `specdec up` stops every part it started
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
