"""`specdec distill-draft`: train a pruned-vocabulary draft for a target by distillation.

The draft starts as the target's embedding, first layers and final norm, with an output
projection over the tokens the target predicts most (`specdec.drafts.draft_vocab`,
`specdec.drafts.pruned_draft`). Training minimises KL(p || q) per position, where p is the
target's distribution restricted to the draft vocabulary and renormalised (the target's logits
at the draft columns: one gathered matmul, never the full 262,144-wide row) and q the draft's;
only the layers and the final norm train.
The target runs on the fly under no_grad: on a CPU that costs less than reading cached top-k
logits back would save, and needs no disk.

The held-out metric is greedy acceptance: the share of held-out positions where the draft's argmax
(mapped to full ids) equals the target's argmax over its *full* vocabulary (computed once and
cached), i.e. the per-token acceptance rate alpha of greedy speculation.

OUT holds the servable draft (draft.json, vocab.json, model.safetensors: `--draft-model OUT`),
log.json, progress.png, and checkpoint/ (corpus rows, vocabulary, weights and optimizer state).
Running the same command again resumes from the checkpoint; checkpoint/ is not part of the draft.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specdec.cli.config_flags import add_flags, from_flags
from specdec.core.settings import setting
from specdec.distill.data import default_sources, load_corpus
from specdec.drafts import draft_vocab
from specdec.drafts.pruned_draft import build_pruned_draft, save_pruned_draft, trainable_names
from specdec.runtime.loading import load_model
from specdec.runtime.models import LoadedModel
from specdec.runtime.projection import forward_logits


@dataclass
class DistillConfig:
    target_model: str | None = setting(help="load_model spec of the target (default: the embedded Gemma 3 270M)")
    out: Path = setting(
        help="draft directory to write, and its checkpoint/ (serve it with --draft-model OUT)", type=Path
    )
    layers: int = setting(2, "draft decoder layers, copied from the target's first ones")
    vocab_size: int = setting(32768, "draft vocabulary size (FR-Spec pruning), 0 = full")
    steps: int = setting(300, "optimizer steps (the LR schedule spans them)")
    seq_len: int = setting(256, "tokens per training row, BOS included")
    batch: int = setting(8, "rows per step")
    # A small draft from the target's layers trains stably at it.
    lr: float = setting(1e-3, "peak AdamW learning rate")
    warmup: int = 5  # linear warm-up steps, then cosine decay to lr / 10
    eval_every: int = setting(25, "steps between held-out evaluations")
    checkpoint_every: int = setting(25, "steps between checkpoints (and exports of the draft)")
    heldout_rows: int = 8  # held-out rows evaluated
    # Few: each pays the target's full projection; text counts rank the rest, and cover what the sample misses.
    vocab_sample_tokens: int = setting(2048, "tokens whose full-vocabulary target argmax ranks the vocabulary")
    corpus_mb: float = setting(6.0, "MB of training text read over all sources")
    sources: list[Path] = field(default_factory=default_sources)  # text directories (or files): --corpus
    # Resumes add up. The LR schedule follows whichever of steps or time runs out first, so a
    # budgeted run still ends on a low LR.
    time_budget_min: float | None = setting(
        None, "minutes of training over all runs, setup excluded; the LR decays by time too", type=float
    )
    save_dtype: str = setting("bfloat16", "dtype of the shipped weights", choices=("bfloat16", "float32"))
    seed: int = setting(0, "torch's seed for the run")
    # The serving distribution (specdec.distill.generate). Writing them is target decoding, the
    # slow part of a run, so they are saved and generated once.
    generated_rows: int = setting(0, "training rows the target writes (greedy continuations of corpus openings)")
    generated_share: float = setting(0.75, "share of each batch taken from the generated rows (when there are any)")
    prompt_tokens: int = setting(32, "corpus tokens (BOS included) each generated row starts from")
    generate_batch: int = setting(32, "rows generated at once")
    init_from: Path | None = setting(
        None, "start from this draft directory (or a run's OUT): its vocabulary and weights", type=Path
    )
    # The drafter stops a greedy draft before a token the draft gives less (model_drafter.py).
    # 0.3: the shipped draft's tokens above it are the target's several times as often as those
    # below (docs/distilled-draft.md).
    min_confidence: float = setting(0.3, "greedy stop threshold written into draft.json", type="probability")


def main(argv: list[str] | None = None) -> int:
    config = _parse(sys.argv[1:] if argv is None else argv)
    distill(config)
    return 0


def distill(config: DistillConfig, target: LoadedModel | None = None) -> dict:
    """Train (or resume) the draft in config.out; returns the final log entry."""
    torch.manual_seed(config.seed)
    target = target or load_model(config.target_model)
    ckpt = Path(config.out) / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    _check_same_run(config, ckpt)
    rows, heldout = _corpus(config, target, ckpt)
    vocab = _vocab(config, target, rows, ckpt)
    run = _start(config, target, vocab, ckpt)
    target_argmax = _heldout_targets(target, heldout, ckpt)  # (rows, seq_len) full-vocabulary ids
    generated, heldout_generated = _generated(config, target, rows, heldout, ckpt)

    def evaluate(entry: dict) -> dict:
        entry["heldout_acceptance"] = _acceptance(run.draft, heldout, target_argmax)
        if len(heldout_generated):
            entry["heldout_generated_acceptance"] = _generated_acceptance(
                run.draft, heldout_generated, config.prompt_tokens
            )
        return entry

    if run.step == 0:
        run.log.append(evaluate({"step": 0}))
    _train(run, _batches(config, rows, generated), evaluate)
    if "heldout_acceptance" not in run.log[-1]:
        evaluate(run.log[-1])
    run.save()
    return run.log[-1]


@dataclass
class _Run:
    """A run's training state: what a checkpoint saves and a resume restores."""

    config: DistillConfig
    target: LoadedModel
    ckpt: Path
    draft: torch.nn.Module
    optimizer: torch.optim.Optimizer
    log: list[dict]
    step: int
    seconds: float  # training time over all runs, setup excluded (the time budget counts it)

    def save(self) -> None:
        _save(self.config, self.ckpt, self.draft, self.target, self.optimizer, self.step, self.seconds, self.log)


def _start(config: DistillConfig, target: LoadedModel, vocab: list[int], ckpt: Path) -> _Run:
    """The draft over vocab with only its trainable parameters given to AdamW, resumed from the
    checkpoint if there is one, else started from config.init_from if given."""
    draft = build_pruned_draft(target.model, config.layers, vocab)
    names = trainable_names(draft)
    params = dict(draft.named_parameters())
    for name in names:
        params[name].requires_grad_(True)
    optimizer = torch.optim.AdamW([params[n] for n in names], lr=config.lr, weight_decay=0.0)
    state = _resume(ckpt, params, optimizer)
    if state["step"] == 0 and config.init_from is not None:
        _init_weights(config.init_from, params)
    return _Run(config, target, ckpt, draft, optimizer, state["log"], state["step"], state.get("seconds", 0.0))


def _batches(config: DistillConfig, rows: torch.Tensor, generated: torch.Tensor):
    """step -> that step's batch: corpus rows in a seeded order and, when the target wrote rows,
    config.generated_share of each batch from those in an order of their own. The orders depend
    only on the seed, so a resumed run trains on the batches the uninterrupted one would have."""
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(config.seed))
    n_generated = round(config.batch * config.generated_share) if len(generated) else 0
    generated_order = torch.randperm(max(len(generated), 1), generator=torch.Generator().manual_seed(config.seed + 1))
    n_corpus = config.batch - n_generated

    def batch(step: int) -> torch.Tensor:  # (config.batch, seq_len)
        picks = [order[(step * n_corpus + i) % len(rows)] for i in range(n_corpus)]
        gen_picks = [generated_order[(step * n_generated + i) % len(generated)] for i in range(n_generated)]
        return torch.cat(
            [
                rows[torch.stack(picks)] if picks else rows[:0],
                generated[torch.stack(gen_picks)] if gen_picks else rows[:0],
            ]
        )

    return batch


def _train(run: _Run, batches, evaluate) -> None:
    """Step until config.steps or the time budget, logging every step, evaluating every
    eval_every and checkpointing every checkpoint_every."""
    from tqdm import tqdm

    config = run.config
    bar = tqdm(total=config.steps, initial=run.step, desc="distill", unit="step", dynamic_ncols=True)
    loss_ema = None
    while run.step < config.steps:
        if _time_fraction(config, run.seconds) >= 1.0:
            bar.write(f"time budget of {config.time_budget_min} min reached at step {run.step}")
            break
        batch = batches(run.step)
        lr = _lr(config, run.step, _time_fraction(config, run.seconds))
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.monotonic()
        loss = train_step(run.draft, run.target, batch, run.optimizer)
        run.seconds += time.monotonic() - t0
        run.step += 1
        loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
        entry = {"step": run.step, "kl": loss, "lr": lr, "seconds": round(run.seconds, 1)}
        if run.step % config.eval_every == 0 or run.step == config.steps:
            evaluate(entry)
            shown = entry.get("heldout_generated_acceptance", entry["heldout_acceptance"])
            bar.set_postfix(kl=f"{loss_ema:.3f}", acc=f"{shown:.3f}")
        else:
            bar.set_postfix(kl=f"{loss_ema:.3f}")
        run.log.append(entry)
        bar.update(1)
        if run.step % config.checkpoint_every == 0:
            run.save()
    bar.close()


def train_step(draft, target: LoadedModel, batch: torch.Tensor, optimizer: torch.optim.Optimizer) -> float:
    """One AdamW step on KL(p_target|draft vocab || q_draft), averaged over every position."""
    head = draft.get_output_embeddings()
    with torch.no_grad():
        hidden = target.model.base_model(input_ids=batch, use_cache=False).last_hidden_state  # (B, T, d)
        p_log = F.log_softmax(head.draft_logits(hidden).float(), dim=-1)  # (B, T, V_d), renormalised over V_d
    draft.train()
    q_logits = head.draft_logits(draft.base_model(input_ids=batch, use_cache=False).last_hidden_state)  # (B, T, V_d)
    q_log = F.log_softmax(q_logits.float(), dim=-1)
    kl = F.kl_div(q_log.flatten(0, 1), p_log.flatten(0, 1), log_target=True, reduction="batchmean")
    optimizer.zero_grad(set_to_none=True)
    kl.backward()
    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    optimizer.step()
    draft.eval()
    return kl.item()


@torch.no_grad()
def _draft_argmax(draft, rows: torch.Tensor, chunk: int = 4) -> torch.Tensor:
    """(rows, T) the draft's greedy token at every position, as full-vocabulary ids."""
    head = draft.get_output_embeddings()
    out = []
    for start in range(0, len(rows), chunk):  # chunks: a row's draft logits are T x 32,768 floats
        hidden = draft.base_model(input_ids=rows[start : start + chunk], use_cache=False).last_hidden_state
        out.append(head.to_full_ids(head.draft_logits(hidden).argmax(-1)))
    return torch.cat(out)


def _acceptance(draft, heldout: torch.Tensor, target_argmax: torch.Tensor) -> float:
    """Share of held-out positions where the draft's greedy token is the target's."""
    return float((_draft_argmax(draft, heldout) == target_argmax).float().mean())


def _generated_acceptance(draft, rows: torch.Tensor, prompt_len: int) -> float:
    """Share of generated tokens (greedy: each is the target's argmax) the draft predicts."""
    return float((_draft_argmax(draft, rows)[:, prompt_len - 1 : -1] == rows[:, prompt_len:]).float().mean())


def _generated(
    config: DistillConfig, target: LoadedModel, rows: torch.Tensor, heldout: torch.Tensor, ckpt: Path
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's continuations of training openings, and of held-out ones (evaluated)."""
    if config.generated_rows <= 0:
        return rows[:0], rows[:0]
    from specdec.distill.generate import generated_rows

    p, seq, b = config.prompt_tokens, config.seq_len, config.generate_batch
    # Held-out first: a short run still measures what it trained for.
    heldout_generated = generated_rows(target, heldout[:, :p], seq, ckpt / "heldout_generated.pt", b)
    # Openings of training rows picked by a permutation of their own (not the batches' order).
    picks = torch.randperm(len(rows), generator=torch.Generator().manual_seed(config.seed + 2))[: config.generated_rows]
    return generated_rows(target, rows[picks, :p], seq, ckpt / "generated.pt", b), heldout_generated


def _init_weights(source: Path, params: dict) -> None:
    """Start from another run's weights: its fp32 checkpoint when there is one, else its draft."""
    source = Path(source)
    state = source / "checkpoint" / "state.pt"
    weights = torch.load(state)["weights"] if state.is_file() else load_file(str(source / "model.safetensors"))
    if not set(weights) <= set(params) or any(params[n].shape != w.shape for n, w in weights.items()):
        raise ValueError(f"{source}: its weights do not fit a draft of this shape (--layers must match)")
    _copy_weights(params, weights)
    print(f"initialised from {source}", file=sys.stderr)


@torch.no_grad()
def _copy_weights(params: dict, weights: dict) -> None:
    for name, tensor in weights.items():
        params[name].copy_(tensor.to(params[name].dtype))


def _check_same_run(config: DistillConfig, ckpt: Path) -> None:
    """A checkpoint resumes only the run that made it: the flags that shape its cached rows,
    vocabulary and weights must not change (the others, --steps included, may)."""
    fixed = {
        "target_model": config.target_model,
        "layers": config.layers,
        "vocab_size": config.vocab_size,
        "seq_len": config.seq_len,
    }
    path = ckpt / "run.json"
    if not path.is_file():
        path.write_text(json.dumps(fixed) + "\n")
        return
    changed = sorted(k for k, v in json.loads(path.read_text()).items() if fixed.get(k) != v)
    if changed:
        raise ValueError(
            f"{ckpt} is a run with other {', '.join(changed)}: "
            "resume it with the same flags, or delete it to start over"
        )


def _corpus(config: DistillConfig, target: LoadedModel, ckpt: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Training and held-out rows, tokenized once and kept in the checkpoint (resume reuses them)."""
    path = ckpt / "data.pt"
    if path.is_file():
        data = torch.load(path)
        return data["train"], data["heldout"]
    corpus = load_corpus(target.tokenizer, config.sources, config.seq_len, config.corpus_mb, seed=config.seed)
    if len(corpus.train) < config.batch or len(corpus.heldout) < 1:
        raise ValueError(
            f"corpus too small: {len(corpus.train)} training and {len(corpus.heldout)} held-out rows "
            f"of {config.seq_len} tokens"
        )
    heldout = corpus.heldout[: config.heldout_rows]
    _atomic_save({"train": corpus.train, "heldout": heldout}, path)
    print(
        f"corpus: {corpus.files} files, {corpus.chars / 1e6:.1f} M chars, {corpus.train.numel()} training tokens",
        file=sys.stderr,
    )
    return corpus.train, heldout


@torch.no_grad()
def _vocab(config: DistillConfig, target: LoadedModel, rows: torch.Tensor, ckpt: Path) -> list[int]:
    """The pruned vocabulary, chosen once (target argmax counts on a sample, text counts) and kept."""
    if (ckpt / draft_vocab.VOCAB_FILE).is_file():
        return draft_vocab.load_vocab(ckpt)
    if config.init_from is not None:  # its weights were trained against its vocabulary: keep it
        ids = draft_vocab.load_vocab(Path(config.init_from))
        draft_vocab.save_vocab(ckpt, ids)
        return ids
    full = target.vocab_size
    size = config.vocab_size or full
    predictions = torch.zeros(full, dtype=torch.long)
    sample = rows[: max(1, config.vocab_sample_tokens // rows.shape[1])]
    for row in sample:
        logits = forward_logits(target.model, row.numel(), input_ids=row[None])  # (1, T, vocab)
        predictions += draft_vocab.count_predictions(logits)
    always = draft_vocab.special_ids(target.tokenizer, target.eos_token_ids)
    ids = draft_vocab.choose_vocab(predictions, min(size, full), always, draft_vocab.count_tokens(rows, full))
    draft_vocab.save_vocab(ckpt, ids)
    print(
        f"draft vocabulary: {len(ids)} tokens, covering {draft_vocab.coverage(ids, predictions):.1%} "
        f"of target argmax on {sample.numel()} tokens",
        file=sys.stderr,
    )
    return ids


@torch.no_grad()
def _heldout_targets(target: LoadedModel, heldout: torch.Tensor, ckpt: Path) -> torch.Tensor:
    path = ckpt / "heldout_targets.pt"
    if path.is_file():
        return torch.load(path)
    argmax = torch.stack(
        [forward_logits(target.model, row.numel(), input_ids=row[None])[0].argmax(-1) for row in heldout]
    )
    _atomic_save(argmax, path)
    return argmax


def _resume(ckpt: Path, params: dict, optimizer: torch.optim.Optimizer) -> dict:
    path = ckpt / "state.pt"
    if not path.is_file():
        return {"step": 0, "log": []}
    state = torch.load(path)
    _copy_weights(params, state["weights"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"resuming at step {state['step']}", file=sys.stderr)
    return state


def _save(
    config: DistillConfig, ckpt: Path, draft, target: LoadedModel, optimizer, step: int, seconds: float, log: list[dict]
) -> None:
    """Checkpoint (fp32 weights, optimizer, log), then the servable draft, log.json and the plot."""
    trained = set(trainable_names(draft))
    weights = {name: p.detach().clone() for name, p in draft.named_parameters() if name in trained}
    state = {"step": step, "seconds": seconds, "weights": weights, "optimizer": optimizer.state_dict(), "log": log}
    _atomic_save(state, ckpt / "state.pt")
    save_pruned_draft(
        draft, config.out, config.target_model, target.model, getattr(torch, config.save_dtype), config.min_confidence
    )
    meta = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    meta["sources"] = [str(s) for s in config.sources]
    (Path(config.out) / "log.json").write_text(json.dumps({"config": meta, "log": log}, indent=1) + "\n")
    _plot(log, Path(config.out) / "progress.png")


def _plot(log: list[dict], path: Path) -> None:
    try:  # matplotlib is optional: `pip install matplotlib` for the plot
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    kl = [(e["step"], e["kl"]) for e in log if "kl" in e]
    acc = [(e["step"], e["heldout_acceptance"]) for e in log if "heldout_acceptance" in e]
    if kl:
        top.plot(*zip(*kl), lw=0.8)
    top.set_ylabel("train KL(p || q), nats")
    if acc:
        bottom.plot(*zip(*acc), marker="o", label="corpus text")
    generated = [(e["step"], e["heldout_generated_acceptance"]) for e in log if "heldout_generated_acceptance" in e]
    if generated:
        bottom.plot(*zip(*generated), marker="s", label="target's own continuations")
        bottom.legend()
    bottom.set_ylabel("held-out greedy acceptance")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _time_fraction(config: DistillConfig, seconds: float) -> float:
    return 0.0 if config.time_budget_min is None else seconds / (60 * config.time_budget_min)


def _lr(config: DistillConfig, step: int, time_fraction: float = 0.0) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = min(1.0, max(time_fraction, (step - config.warmup) / max(1, config.steps - config.warmup)))
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)  # a kill mid-save leaves the previous checkpoint intact


def _parse(argv: list[str]) -> DistillConfig:
    p = argparse.ArgumentParser(
        prog="specdec distill-draft",
        description="Distil a pruned-vocabulary draft from a target; running it again resumes from OUT/checkpoint.",
    )
    add_flags(p, DistillConfig, defaults={"target_model": None})
    p.add_argument(
        "--corpus",
        type=Path,
        action="append",
        help="text directory or file (repeatable) [stdlib source, /usr/share/doc, /usr/share/man]",
    )
    a = p.parse_args(argv)
    if not 0.0 <= a.generated_share <= 1.0:
        p.error(f"--generated-share must lie in [0, 1], got {a.generated_share}")
    if a.generated_rows and not 0 < a.prompt_tokens < a.seq_len:
        p.error(f"--prompt-tokens must lie in (0, --seq-len), got {a.prompt_tokens}")
    return from_flags(DistillConfig, a, sources=a.corpus or default_sources())


if __name__ == "__main__":
    sys.exit(main())
