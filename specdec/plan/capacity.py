"""Capacity planning: how many target and draft replicas a load needs, from measured costs.

In the manner of NVIDIA Dynamo's SLA planner (profile the engine offline, interpolate its TTFT and
ITL, size each tier so the SLA holds), for speculative decoding. The model, from the bottom up:

  pass        one target pass over `rows` sequences of `t` positions each (t = k + 1 when
              verifying k drafts) costs  P(rows, t) = a + b·rows + c·rows·t  ms, fitted by least
              squares to the bench's measured passes (a term whose fit is negative is dropped).
  prefill     a prompt of L tokens costs  F(L) = p0 + p1·L  ms, fitted the same way (from the
              pass fit with one row when the bench has no prefill points).
  draft       one draft step over `rows` sequences costs  D(rows) = d0 + d1·rows  ms; a round
              drafts k steps. The draft replica's batch b_d is the largest with
              k·D(b_d) <= draft_share · ITL_limit · E (its share of the round).
  round       R(b) = k·D(min(b, b_d)) + P(b, k+1) + o + o_r·b, with o + o_r·b the per-round
              overhead outside the pass (transport, coordination): o_r is what each stream's
              round costs the host besides the pass, which on a shared host serializes with it.
  tokens      E = (1 − α^(k+1)) / (1 − α) tokens a round commits (Leviathan et al. 2023), with α
              the chance that a draft token is accepted (k = 0: E = 1).
  prefill     at concurrency b a replica admits λ_r = b / T requests a second, and spends the
  share       fraction u = λ_r·F_b/1000 of its time on their prompts, so a decode round takes
              R(b) / (1 − u) of wall time (a fluid model). A prompt rides in a pass the other
              rows run anyway (the scheduler mixes prefill chunks into decode passes), so what it
              adds is its positions and its share of the pass's fixed cost:
              F_b = p1·L_in + p0 / b (b = 1: the whole F(L_in)).
  request     ITL(b) = R(b) / ((1 − u)·E);  service TTFT = F(L_in) + R(b)/2 (it waits half a pass
              on average);  T(b) = TTFT + (L_out − 1)·ITL(b), solved for the fixed point in λ_r.

A replica's batch B is the largest b (up to max_batch) with ITL(b) <= the ITL limit; its capacity
is B / T(B) requests a second. Target replicas N = ceil(λ / capacity), raised until the expected
TTFT, the service TTFT plus the Erlang-C wait of an M/M/B queue (B slots a replica, arrivals λ/N,
service T), meets the TTFT limit. At that N each replica runs at its mean concurrency b_op
(Little: b_op = (λ/N)·T(b_op)), which sets the expected ITL and TTFT. Draft replicas:
ceil(λ·T / b_d), the sequences in flight over the rows one draft replica serves (0 when k = 0).
A closed loop of N streams on one replica (the local check) is T(N) at b = N: N·L_out / T tokens/s.

Costs come from a JSON file (`python -m specdec.bench.plan_costs --json ...` writes one):
  {"pass_ms": [{"rows": 1, "tokens_per_row": 1, "ms": 55.0}, ...],
   "prefill_ms": [{"tokens": 128, "ms": 90.0}, ...],          optional
   "draft_step_ms": [{"rows": 1, "ms": 0.2}, ...],            optional: free drafts
   "round_overhead_ms": 12.0, "round_overhead_per_row_ms": 0.5,   the latter optional
   "draft_tokens": 4, "max_batch": 64,
   "acceptance": {"free": 0.55, "copy": 0.8}}                 α by workload
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from specdec.core.settings import setting


class PlanError(ValueError):
    """Bad input or a target the costs cannot meet; `flag` names the flag to change."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class PlanConfig:
    costs: str = setting(help="bench result file with pass, prefill and draft costs (plan_costs.py --json)")
    rate: float = setting(1.0, "target load, requests per second")
    prompt_tokens: int = setting(512, "prompt tokens a request")
    output_tokens: int = setting(256, "output tokens a request")
    ttft_ms: float = setting(2000.0, "time-to-first-token limit, ms (the mean the model predicts)")
    itl_ms: float = setting(50.0, "inter-token latency limit, ms")
    workload: str | None = setting(None, "the acceptance entry of the costs file to use (default: the first)")
    alpha: float | None = setting(None, "per-token acceptance α, over the costs file's", type=float)
    draft_tokens: int | None = setting(None, "draft tokens a round, k (default: the costs file's; 0: none)", type=int)
    max_batch: int | None = setting(
        None, "most sequences a target replica batches (default: the costs file's)", type=int
    )
    draft_share: float = setting(0.25, "share of a round the draft may take, for sizing the draft tier")
    json_path: str | None = setting(None, "also write the plan here", flag="json", metavar="PATH")


@dataclass(frozen=True)
class LinearCost:
    """ms = fixed + per_row·rows + per_position·positions (positions = rows × tokens a row)."""

    fixed_ms: float
    per_row_ms: float
    per_position_ms: float
    rms_error_ms: float = 0.0

    def ms(self, rows: float, tokens_per_row: float = 1.0) -> float:
        return self.fixed_ms + self.per_row_ms * rows + self.per_position_ms * rows * tokens_per_row


def fit_linear(points: list[tuple[float, float, float]]) -> LinearCost:
    """Least squares of ms on (1, rows, positions) over `points` = [(rows, positions, ms)]; a term
    whose coefficient comes out negative is dropped and the rest refitted, and where the data cannot
    separate the terms (one token a row: positions = rows) the rows term goes."""
    terms = [0, 1, 2]
    columns = [lambda r, p: 1.0, lambda r, p: r, lambda r, p: p]
    while terms:
        coef = _least_squares([[columns[t](r, p) for t in terms] for r, p, _ in points], [ms for *_, ms in points])
        if coef is not None and all(c >= 0 for c in coef):
            full = dict(zip(terms, coef))
            cost = LinearCost(full.get(0, 0.0), full.get(1, 0.0), full.get(2, 0.0))
            err = math.sqrt(sum((cost.ms(r, p / r if r else 0) - ms) ** 2 for r, p, ms in points) / len(points))
            return LinearCost(cost.fixed_ms, cost.per_row_ms, cost.per_position_ms, err)
        if coef is None:  # a column of zeros goes first; else rows, so positions keep pricing k + 1 tokens
            zero = [i for i, t in enumerate(terms) if all(columns[t](r, p) == 0 for r, p, _ in points)]
            drop = zero[0] if zero else terms.index(1) if 1 in terms else len(terms) - 1
        else:
            drop = min(range(len(terms)), key=lambda i: coef[i])
        terms.pop(drop)
    return LinearCost(0.0, 0.0, 0.0)


def _least_squares(x: list[list[float]], y: list[float]) -> list[float] | None:
    """Normal equations by Gaussian elimination; None when singular."""
    n = len(x[0])
    a = [
        [sum(row[i] * row[j] for row in x) for j in range(n)] + [sum(row[i] * v for row, v in zip(x, y))]
        for i in range(n)
    ]
    for i in range(n):
        pivot = max(range(i, n), key=lambda r: abs(a[r][i]))
        if abs(a[pivot][i]) < 1e-9 * max(1.0, max(abs(v) for row in a for v in row[:n])):
            return None
        a[i], a[pivot] = a[pivot], a[i]
        for r in range(n):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [v - f * w for v, w in zip(a[r], a[i])]
    return [a[i][n] / a[i][i] for i in range(n)]


@dataclass(frozen=True)
class Costs:
    target_pass: LinearCost  # rows, positions
    prefill: LinearCost  # ms = fixed + per_position·prompt tokens
    draft_step: LinearCost  # one draft step: ms = fixed + per_row·rows
    round_overhead_ms: float
    draft_tokens: int
    max_batch: int
    acceptance: dict[str, float]
    round_overhead_per_row_ms: float = 0.0

    def overhead_ms(self, rows: float) -> float:
        """A round's time outside the pass and the draft, at `rows` sequences."""
        return self.round_overhead_ms + self.round_overhead_per_row_ms * rows


def load_costs(path: str) -> Costs:
    file = Path(path)
    if not file.is_file():
        raise PlanError("--costs", f"no such file: {path}")
    try:
        raw = json.loads(file.read_text())
        passes = [
            (float(p["rows"]), float(p["rows"]) * float(p.get("tokens_per_row", 1)), float(p["ms"]))
            for p in raw["pass_ms"]
        ]
        prefill = [(1.0, float(p["tokens"]), float(p["ms"])) for p in raw.get("prefill_ms", [])]
        draft = [(float(p["rows"]), 0.0, float(p["ms"])) for p in raw.get("draft_step_ms", [])]
        overhead = float(raw.get("round_overhead_ms", 0.0))
        overhead_per_row = float(raw.get("round_overhead_per_row_ms", 0.0))
        k, max_batch = int(raw.get("draft_tokens", 0)), int(raw.get("max_batch", 64))
        acceptance = {str(w): float(a) for w, a in raw.get("acceptance", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise PlanError(
            "--costs", f"{path} is not a costs file (pass_ms: [{{rows, tokens_per_row, ms}}]): {e!r}"
        ) from None
    if not passes or any(r < 1 or ms < 0 for r, _, ms in passes):
        raise PlanError("--costs", f"{path}: pass_ms needs points with rows >= 1 and ms >= 0")
    if overhead < 0 or overhead_per_row < 0:
        raise PlanError("--costs", f"{path}: round_overhead_ms and round_overhead_per_row_ms must be >= 0")
    target_pass = fit_linear(passes)
    if prefill:
        fitted = fit_linear(prefill)
        prefill_cost = LinearCost(fitted.fixed_ms + fitted.per_row_ms, 0.0, fitted.per_position_ms, fitted.rms_error_ms)
    else:  # a prompt is one row of L positions
        prefill_cost = LinearCost(target_pass.fixed_ms + target_pass.per_row_ms, 0.0, target_pass.per_position_ms)
    return Costs(
        target_pass,
        prefill_cost,
        fit_linear(draft) if draft else LinearCost(0, 0, 0),
        overhead,
        k,
        max_batch,
        acceptance,
        overhead_per_row,
    )


def tokens_per_round(alpha: float, k: int) -> float:
    """E = (1 − α^(k+1)) / (1 − α): tokens one round commits with k drafts (Leviathan et al.)."""
    if k == 0:
        return 1.0
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass(frozen=True)
class Point:
    """One replica at mean concurrency `batch`."""

    batch: float
    round_ms: float  # wall time of a decode round, prefill share included
    itl_ms: float
    service_ttft_ms: float  # prefill and half a pass, no queueing
    request_ms: float
    tokens_per_s: float  # of this replica

    @property
    def requests_per_s(self) -> float:
        return 1000 * self.batch / self.request_ms


@dataclass(frozen=True)
class Model:
    costs: Costs
    prompt_tokens: int
    output_tokens: int
    alpha: float
    k: int
    draft_batch: float  # rows a draft replica serves

    def point(self, batch: float) -> Point | None:
        """The fluid fixed point of one replica at concurrency `batch`; None when prefills alone
        would fill the replica."""
        c, k = self.costs, self.k
        draft = k * c.draft_step.ms(min(batch, self.draft_batch)) if k else 0.0
        busy = draft + c.target_pass.ms(batch, k + 1) + c.overhead_ms(batch)
        prefill = c.prefill.ms(1, self.prompt_tokens)
        riding = prefill - c.prefill.fixed_ms * (1 - 1 / max(batch, 1.0))  # F_b
        e = tokens_per_round(self.alpha, k)
        request = prefill + busy / 2 + (self.output_tokens - 1) * busy / e
        for _ in range(200):
            share = (batch / request) * riding  # λ_r · F_b, per ms
            if share >= 1:
                return None
            round_ms = busy / (1 - share)
            ttft = prefill + round_ms / 2
            new = ttft + (self.output_tokens - 1) * round_ms / e
            if abs(new - request) < 1e-9 * new:
                break
            request = new
        return Point(batch, round_ms, round_ms / e, ttft, request, 1000 * batch * self.output_tokens / request)


def erlang_c_wait_ms(servers: int, offered: float, service_ms: float) -> float:
    """Mean wait of an M/M/c queue: C(c, a)·S / (c − a), a = λ·S; inf at or past saturation."""
    if offered >= servers:
        return math.inf
    term, total = 1.0, 1.0
    for i in range(1, servers):
        term *= offered / i
        total += term
    last = term * offered / servers * servers / (servers - offered)
    return last / (total + last) * service_ms / (servers - offered)


@dataclass(frozen=True)
class CapacityPlan:
    """How many replicas of each tier a load needs, and what each replica runs at."""

    target_replicas: int
    draft_replicas: int
    batch_limit: int  # B: the ITL-bound batch per replica
    alpha: float
    draft_tokens: int
    tokens_per_round: float
    capacity_tokens_per_s: float  # all replicas at B
    tokens_per_s: float  # at the requested rate
    operating: Point  # each replica at the requested rate
    ttft_ms: float  # service TTFT plus queueing

    def as_dict(self) -> dict:
        return {
            "target_replicas": self.target_replicas,
            "draft_replicas": self.draft_replicas,
            "batch_limit": self.batch_limit,
            "alpha": self.alpha,
            "draft_tokens": self.draft_tokens,
            "tokens_per_round": self.tokens_per_round,
            "capacity_tokens_per_s": self.capacity_tokens_per_s,
            "tokens_per_s": self.tokens_per_s,
            "batch": self.operating.batch,
            "itl_ms": self.operating.itl_ms,
            "ttft_ms": self.ttft_ms,
            "request_ms": self.operating.request_ms,
        }


def model_for(config: PlanConfig, costs: Costs) -> Model:
    for flag, value in (("--rate", config.rate), ("--ttft-ms", config.ttft_ms), ("--itl-ms", config.itl_ms)):
        if not (value > 0 and math.isfinite(value)):
            raise PlanError(flag, f"must be a finite number > 0, got {value}")
    for flag, value in (("--prompt-tokens", config.prompt_tokens), ("--output-tokens", config.output_tokens)):
        if value < 1:
            raise PlanError(flag, f"must be >= 1, got {value}")
    if not 0 < config.draft_share <= 1:
        raise PlanError("--draft-share", f"must be in (0, 1], got {config.draft_share}")
    k = costs.draft_tokens if config.draft_tokens is None else config.draft_tokens
    if k < 0:
        raise PlanError("--draft-tokens", f"must be >= 0, got {k}")
    if config.alpha is not None:
        alpha = config.alpha
    elif config.workload is not None:
        if config.workload not in costs.acceptance:
            raise PlanError(
                "--workload", f"{config.workload!r} is not in the costs file ({', '.join(costs.acceptance)})"
            )
        alpha = costs.acceptance[config.workload]
    elif k == 0:
        alpha = 0.0
    elif costs.acceptance:
        alpha = next(iter(costs.acceptance.values()))
    else:
        raise PlanError("--alpha", "the costs file has no acceptance: give --alpha or --draft-tokens 0")
    if not 0 <= alpha <= 1:
        raise PlanError("--alpha", f"must be in [0, 1], got {alpha}")
    e = tokens_per_round(alpha, k)
    draft_batch = math.inf
    if k and (costs.draft_step.per_row_ms or costs.draft_step.fixed_ms):
        budget = config.draft_share * config.itl_ms * e / k  # ms a draft step may take
        if costs.draft_step.ms(1) > budget:
            raise PlanError("--itl-ms", f"one draft step takes {costs.draft_step.ms(1):.2f} ms, over the draft's share")
        if costs.draft_step.per_row_ms:
            draft_batch = max(1.0, math.floor((budget - costs.draft_step.fixed_ms) / costs.draft_step.per_row_ms))
    return Model(costs, config.prompt_tokens, config.output_tokens, alpha, k, draft_batch)


def plan(config: PlanConfig, costs: Costs) -> CapacityPlan:
    model = model_for(config, costs)
    max_batch = costs.max_batch if config.max_batch is None else config.max_batch
    if max_batch < 1:
        raise PlanError("--max-batch", f"must be >= 1, got {max_batch}")
    points = [p for b in range(1, max_batch + 1) if (p := model.point(b)) is not None and p.itl_ms <= config.itl_ms]
    if not points:
        one = model.point(1)
        got = "prefills fill a replica" if one is None else f"{one.itl_ms:.1f} ms at one stream"
        raise PlanError("--itl-ms", f"{config.itl_ms:g} ms cannot be met: {got}")
    best = points[-1]
    floor = model.point(1e-6)
    if floor is None or floor.service_ttft_ms > config.ttft_ms:
        took = "prefills fill a replica" if floor is None else f"the prefill alone takes {floor.service_ttft_ms:.0f} ms"
        raise PlanError("--ttft-ms", f"{config.ttft_ms:g} ms cannot be met: {took}")

    def meets(n: int) -> tuple[Point, float] | None:
        operating = _operating_point(model, config.rate / n, best.batch)
        if operating is None or operating.itl_ms > config.itl_ms:
            return None
        wait = erlang_c_wait_ms(int(best.batch), config.rate / n * operating.request_ms / 1000, operating.request_ms)
        return (operating, wait) if operating.service_ttft_ms + wait <= config.ttft_ms else None

    # TTFT falls as replicas are added: double past the first that meets it, then bisect.
    low = max(1, math.ceil(config.rate / best.requests_per_s))
    high = low
    while meets(high) is None:
        if high > 10_000_000:
            raise PlanError("--ttft-ms", f"{config.ttft_ms:g} ms cannot be met at {config.rate:g} requests/s")
        low, high = high + 1, 2 * high
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if meets(mid) else (mid + 1, high)
    replicas = high
    operating, wait = meets(replicas)
    in_flight = config.rate * operating.request_ms / 1000
    drafts = 0 if model.k == 0 else math.ceil(in_flight / min(model.draft_batch, in_flight))
    return CapacityPlan(
        target_replicas=replicas,
        draft_replicas=drafts,
        batch_limit=int(best.batch),
        alpha=model.alpha,
        draft_tokens=model.k,
        tokens_per_round=tokens_per_round(model.alpha, model.k),
        capacity_tokens_per_s=replicas * best.tokens_per_s,
        tokens_per_s=config.rate * config.output_tokens,
        operating=operating,
        ttft_ms=operating.service_ttft_ms + wait,
    )


def _operating_point(model: Model, rate_per_s: float, batch_limit: float) -> Point | None:
    """The replica's mean concurrency at `rate_per_s` requests a second (Little's law, iterated)."""
    batch = 1.0
    for _ in range(200):
        point = model.point(batch)
        if point is None:
            return None
        new = rate_per_s * point.request_ms / 1000
        if new > batch_limit:
            return None
        if abs(new - batch) < 1e-9:
            break
        batch = max(new, 1e-6)
    return model.point(batch)


def closed_loop_tokens_per_s(
    costs: Costs, streams: int, prompt_tokens: int, output_tokens: int, alpha: float, k: int
) -> float:
    """Tokens/s of `streams` back-to-back streams on one replica (what the stack bench measures)."""
    point = Model(costs, prompt_tokens, output_tokens, alpha, k, math.inf).point(streams)
    return 0.0 if point is None else point.tokens_per_s


def report(config: PlanConfig, result: CapacityPlan) -> list[str]:
    op = result.operating
    return [
        f"load: {config.rate:g} requests/s, {config.prompt_tokens} prompt + {config.output_tokens} output tokens; "
        f"limits TTFT {config.ttft_ms:g} ms, ITL {config.itl_ms:g} ms",
        f"speculation: k = {result.draft_tokens}, α = {result.alpha:.3f}, {result.tokens_per_round:.2f} tokens a round",
        f"target replicas: {result.target_replicas}  (at most {result.batch_limit} sequences each by the ITL limit)",
        f"draft replicas:  {result.draft_replicas}",
        f"expected: {result.tokens_per_s:,.0f} tokens/s ({result.capacity_tokens_per_s:,.0f} at capacity), "
        f"{op.batch:.1f} sequences a replica, ITL {op.itl_ms:.1f} ms, TTFT {result.ttft_ms:.0f} ms "
        f"(prefill {op.service_ttft_ms:.0f} + queue {result.ttft_ms - op.service_ttft_ms:.0f}), "
        f"{op.request_ms / 1000:.2f} s a request",
    ]
