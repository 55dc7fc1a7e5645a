"""The local stack: `LocalStack` is `specdec up` and
`specdec demo`: a draft server subprocess, a target pool on a local Ray, and the coordinator in
this process, stopped in the reverse order.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass, field

import grpc
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from specdec.coordinator.clients import DraftClient
from specdec.coordinator.engine import EngineConfig
from specdec.coordinator.remote import connect_engine
from specdec.coordinator.server import GenerationServer, ServerConfig
from specdec.core.settings import setting
from specdec.runtime.compiled import COMPILE_MODES
from specdec.runtime.loading import prepare
from specdec.target_service.actor import ActorConfig
from specdec.target_service.pool import NAMESPACE, PREFIX, PoolConfig, TargetPool, launch
from specdec.telemetry.metrics import MetricsServer
from specdec.telemetry.tracing import TRACE_FILE_ENV


@dataclass(frozen=True)
class StackConfig:
    target_model: str | None = None  # load_model spec; None = the embedded default
    draft_model: str = "ngram"  # the draft server's model, or "ngram" (prompt lookup, no model)
    target_replicas: int = setting(1, "target actors on the local Ray")
    kv_cache_bytes: int | None = setting(  # None: the actor's default
        None,
        "each target actor's KV block pool, e.g. 4GiB (default: a quarter of free RAM, 90% of free GPU memory)",
        type="byte_size",
    )
    compile: str = setting(
        "off",
        "the target actors' decode-shaped passes through torch.compile: inductor, or cudagraphs (GPU only)",
        choices=COMPILE_MODES,
    )
    max_batch: int = setting(32, "rounds one target pass verifies at most", type="positive_int")
    ray_redis: str | None = setting(
        None,
        "a Redis for the local Ray head's GCS: GCS fault tolerance, a restarted GCS recovers the "
        "cluster while the actors keep serving (default: none, the GCS state in memory)",
        metavar="HOST:PORT",
    )
    ray_redis_password: str | None = setting(None, "the password of --ray-redis", secret=True, repr=False)
    pool_name: str = PREFIX  # actors are <pool_name>-0 .. -(n-1)
    namespace: str = NAMESPACE
    trace_file: str | None = setting(  # JSON lines
        None,
        "every part appends its finished spans here, for `specdec trace` "
        "(default ~/.cache/specdec/traces.jsonl; '' for none)",
    )
    metrics_port: int = setting(
        9464,
        "the coordinator's Prometheus port on --host; 0 picks a free one; "
        "the draft server and target actors take free ones, printed at start",
        type="port",
    )
    draft_start_s: float = 600.0  # the draft server must answer SERVING within this (a model loads first)
    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)


class LocalStack:
    """Every part on this machine: `async with LocalStack(config) as stack:`; all that it started
    stops on exit, including when starting fails halfway."""

    def __init__(self, config: StackConfig = StackConfig(), tracer: trace.Tracer | None = None):
        self.config = config
        self.tracer = tracer
        self.draft_process: asyncio.subprocess.Process | None = None
        self.draft_address = ""
        self.actor_names: list[str] = []
        self.draft: DraftClient | None = None
        self.server: GenerationServer | None = None
        self.address = ""  # the coordinator's host:port
        self.metrics: MetricsServer | None = None  # the coordinator's
        self.draft_metrics_address = ""
        self.target_metrics_addresses: list[str] = []
        self.target_name = ""
        self._started_ray = False

    async def __aenter__(self) -> LocalStack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        c = self.config
        # Convert the target once here: the draft server (a distilled draft is assembled from the
        # embedded target) and every actor would otherwise each convert it at the same time.
        await asyncio.to_thread(prepare, c.target_model)
        # The draft server starts in its own process while Ray and the target actors start here.
        self.draft_process = await spawn_draft_server(c.draft_model, c.trace_file)
        self._started_ray = not ray.is_initialized()
        cpus = max(os.cpu_count() or 1, c.target_replicas)
        if self._started_ray:
            from specdec.target_service.ray_cluster import connect

            # One CPU per actor at least: Ray would otherwise leave the extra actors pending.
            connect(None, c.namespace, num_cpus=cpus, redis=c.ray_redis, redis_password=c.ray_redis_password)
        else:
            cpus = int(ray.available_resources().get("CPU", 1))
        # The machine's cores shared out over the actors: each runs its matmuls on its share.
        actor = ActorConfig(
            target_model=c.target_model,
            cpus=max(1, cpus // c.target_replicas),
            kv_cache_bytes=c.kv_cache_bytes,
            compile=c.compile,
            max_batch=c.max_batch,
            metrics_port=0,
            trace_file=c.trace_file,
        )
        self.actor_names = await asyncio.to_thread(launch, actor, c.target_replicas, c.pool_name, c.namespace)
        pool = TargetPool(PoolConfig(prefix=c.pool_name, namespace=c.namespace))
        self.draft_address, self.draft_metrics_address = await asyncio.wait_for(
            draft_server_ready(self.draft_process), c.draft_start_s
        )
        self.draft = DraftClient(self.draft_address)
        engine = await connect_engine(self.draft, pool, c.target_model, c.engine, self.tracer)
        self.target_name = engine.target.name
        infos = await asyncio.gather(
            *(ray.get_actor(name, namespace=c.namespace).info.remote() for name in self.actor_names)
        )
        self.target_metrics_addresses = [info["metrics_address"] for info in infos]
        self.metrics = MetricsServer(c.server.host, c.metrics_port)
        self.server = GenerationServer(engine, c.server, self.tracer)
        port = await self.server.start()
        self.address = f"{c.server.host}:{port}"

    async def stop(self) -> None:
        """Coordinator first (its calls in flight may finish), then the draft server, then the
        target actors and the Ray this stack started."""
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.draft is not None:
            await self.draft.close()
            self.draft = None
        if self.draft_process is not None:
            await terminate(self.draft_process)
            self.draft_process = None
        if ray.is_initialized():
            for name in self.actor_names:
                try:
                    ray.kill(ray.get_actor(name, namespace=self.config.namespace), no_restart=True)
                except ValueError:
                    pass  # never started, or already gone
            self.actor_names = []
            if self._started_ray:
                ray.shutdown()


async def spawn_draft_server(draft_model: str, trace_file: str | None = None) -> asyncio.subprocess.Process:
    """A draft server subprocess on a free loopback port (its address: `draft_server_ready`)."""
    flags = ["--draft-model", draft_model, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0"]
    env = {**os.environ, **({TRACE_FILE_ENV: trace_file} if trace_file else {})}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specdec.draft_service", *flags, stdout=asyncio.subprocess.PIPE, env=env
    )


async def draft_server_ready(process: asyncio.subprocess.Process) -> tuple[str, str]:
    """The draft server's (gRPC address, metrics address), once its health says SERVING (its
    model loads after it listens)."""
    line = (await process.stdout.readline()).decode()
    if " listening on " not in line:
        code = await process.wait()
        raise RuntimeError(f"the draft server exited with code {code} before listening")
    address = line.rsplit(" ", 1)[-1].strip()
    metrics_address = (await process.stdout.readline()).decode().rsplit(" ", 1)[-1].strip()
    async with grpc.aio.insecure_channel(address) as channel:
        # Watch streams the status on every change: no polling while the model loads.
        async for reply in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="")):
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return address, metrics_address
    raise RuntimeError(f"the draft server at {address} stopped before serving")


async def terminate(process: asyncio.subprocess.Process, grace_s: float = 15.0) -> None:
    if process.returncode is None:
        try:
            process.send_signal(signal.SIGTERM)  # it drains: NOT_SERVING, calls in flight finish
            await asyncio.wait_for(process.wait(), grace_s)
        except ProcessLookupError:
            pass
        except TimeoutError:
            process.kill()
            await process.wait()
