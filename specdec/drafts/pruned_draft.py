"""A draft built inside its target: the target's embedding, its first layers (trained or not), its
final norm, and an output projection over a pruned vocabulary (see `specdec.drafts.draft_vocab`).

Only what differs from the target is stored: the decoder layers and the final norm (safetensors),
the vocabulary as an index list, and which target it belongs to. At load time the target is
loaded, cut to its first layers, and its embedding and the chosen rows of its output projection
become the draft's, so a Gemma 3 270M draft of 2 layers ships as ~22 MB (bf16) instead of the
671 MB its embedding alone would cost.

Serving sees an ordinary causal LM over the *full* vocabulary: `PrunedHead` writes the draft
logits into a row of -inf, so argmax is the draft's choice as a full-vocabulary id and the warped
q is exactly zero outside the draft vocabulary: a valid distribution over the target's tokens,
which is all the acceptance rule needs to stay lossless. Training uses `draft_logits` (draft
columns only) and never builds the full row.

A directory is recognised by its `draft.json`; `specdec.drafts.loading` passes this format to the
runtime loader, so `--draft-model DIR` serves it like any other model.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from specdec.core.sampling import SamplingParams, warp
from specdec.drafts.draft_vocab import load_vocab, save_vocab
from specdec.drafts.truncate import _decoder_layers, keep_first_layers
from specdec.runtime.loading import load_model
from specdec.runtime.models import LoadedModel
from specdec.runtime.projection import pack_weights, project, use_column_kernels

DRAFT_FILE = "draft.json"  # marks the directory and names the target
WEIGHTS_FILE = "model.safetensors"  # the layers and final norm: what differs from the target
FORMAT = "specdec-pruned-draft/1"
_FINGERPRINT_ROWS = 256  # embedding rows summed to check that the target is the one trained with


class PrunedHead(nn.Module):
    """The output projection restricted to `vocab_ids`, with an optional final logit softcap.

    forward: hidden (..., d) -> (..., full_vocab) logits, -inf outside the draft vocabulary.
    draft_logits: hidden (..., d) -> (..., len(vocab_ids)), column j is token vocab_ids[j].
    """

    def __init__(self, rows: torch.Tensor, vocab_ids: torch.Tensor, full_vocab: int, softcap: float | None):
        super().__init__()
        self.linear = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=rows.device, dtype=rows.dtype)
        self.linear.weight = nn.Parameter(rows.detach().clone(), requires_grad=False)  # (V_d, d)
        self.register_buffer("vocab_ids", vocab_ids.to(rows.device, torch.long), persistent=False)  # (V_d,)
        self.full_vocab = full_vocab
        self.softcap = softcap

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = project(self.linear, hidden)  # (..., V_d); W @ h^T for a few rows, see projection
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.draft_logits(hidden)  # (..., V_d)
        full = small.new_full((*small.shape[:-1], self.full_vocab), float("-inf"))  # (..., vocab)
        return full.index_copy_(-1, self.vocab_ids, small)

    def to_full_ids(self, draft_columns: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary columns -> full-vocabulary token ids."""
        return self.vocab_ids[draft_columns]


def warp_pruned(logits: torch.Tensor, params: SamplingParams, vocab_ids: torch.Tensor) -> torch.Tensor:
    """`warp(logits, params)` for full-vocabulary logits that are -inf outside `vocab_ids`,
    computed on the draft columns only: (..., vocab) -> (..., vocab) probabilities, zero outside.

    The same distribution: -inf columns never enter a top-k set ahead of finite ones and carry no
    top-p mass. Only float summation order differs, and the drafter draws from the q it returns.
    """
    small = warp(logits[..., vocab_ids], params)  # (..., V_d)
    return torch.zeros_like(logits, dtype=small.dtype).index_copy_(-1, vocab_ids, small)


def build_pruned_draft(target: PreTrainedModel, num_layers: int, vocab_ids: list[int]) -> PreTrainedModel:
    """A new model: copies of the target's first `num_layers` layers and final norm (trainable
    later), the target's embedding *shared* (the same tensor, never copied or trained), and a
    `PrunedHead` of the target's output rows `vocab_ids`. The target is left unchanged."""
    embedding, head = target.get_input_embeddings(), target.get_output_embeddings()
    # deepcopy with a memo: the embedding, the old head and the layers we drop are "already
    # copied" as themselves, so the copy costs only the kept layers (the embedding is 671 MB).
    shared = [embedding, head, *_decoder_layers(target)[num_layers:]]
    draft = copy.deepcopy(target, memo={id(m): m for m in shared})
    keep_first_layers(draft, num_layers)
    return _prune_head(draft, head.weight, vocab_ids)


def _prune_head(model: PreTrainedModel, head_weight: torch.Tensor, vocab_ids: list[int]) -> PreTrainedModel:
    """Replace the output projection by a PrunedHead of `head_weight`'s rows `vocab_ids`."""
    config = model.config
    text = config.get_text_config()
    full_vocab = head_weight.shape[0]
    if not vocab_ids or min(vocab_ids) < 0 or max(vocab_ids) >= full_vocab:
        raise ValueError(f"draft vocabulary ids must lie in [0, {full_vocab})")
    softcap = getattr(text, "final_logit_softcapping", None)
    # The head applies the softcap before writing -inf: a softcap after it would turn -inf into
    # -softcap, giving tokens outside the draft vocabulary a non-zero probability.
    if softcap is not None:
        text.final_logit_softcapping = None
    config.tie_word_embeddings = False  # the head is no longer the embedding: never re-tie it
    ids = torch.tensor(vocab_ids, dtype=torch.long, device=head_weight.device)
    model.set_output_embeddings(PrunedHead(head_weight[ids], ids, full_vocab, softcap))
    return model


def trainable_names(draft: PreTrainedModel) -> list[str]:
    """The weights a distilled draft changes and ships: all but the embedding and the head."""
    skip = {id(p) for p in draft.get_input_embeddings().parameters()} | {
        id(p) for p in draft.get_output_embeddings().parameters()
    }
    return [name for name, p in draft.named_parameters() if id(p) not in skip]


def save_pruned_draft(
    draft: PreTrainedModel,
    out: Path,
    target_spec: str | None,
    target: PreTrainedModel,
    dtype: torch.dtype = torch.bfloat16,
    min_confidence: float = 0.0,
) -> None:
    """Write `out`/draft.json, vocab.json and model.safetensors (the trainable weights in `dtype`);
    `min_confidence` is the greedy stop threshold the draft's drafter uses unless told otherwise."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(draft.named_parameters())
    head: PrunedHead = draft.get_output_embeddings()
    vocab_ids = head.vocab_ids.tolist()
    weights = {name: params[name].detach().to("cpu", dtype).contiguous() for name in trainable_names(draft)}
    tmp = out / (WEIGHTS_FILE + ".tmp")
    save_file(weights, str(tmp), metadata={"format": FORMAT})
    tmp.chmod(0o644)  # written 0600; a draft baked into an image by root must stay readable to the service user
    tmp.replace(out / WEIGHTS_FILE)  # an interrupted save never leaves half a weights file
    save_vocab(out, vocab_ids)
    meta = {
        "format": FORMAT,
        "target": _portable(target_spec),
        "num_layers": draft.config.get_text_config().num_hidden_layers,
        "full_vocab": head.full_vocab,
        "draft_vocab": len(vocab_ids),
        "fingerprint": _fingerprint(target, vocab_ids),
        "min_confidence": min_confidence,
    }
    (out / DRAFT_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def is_pruned_draft_dir(spec: str | None) -> bool:
    return spec not in (None, "default") and (Path(spec).expanduser() / DRAFT_FILE).is_file()


def target_spec(directory: Path) -> str | None:
    """The load_model spec of the target this draft was built from (None: the embedded default)."""
    return json.loads((Path(directory).expanduser() / DRAFT_FILE).read_text())["target"]


def load_pruned_draft(
    directory: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedModel:
    """The draft in `directory`, assembled from its target (see the module docstring)."""
    directory = Path(directory).expanduser()
    meta = json.loads((directory / DRAFT_FILE).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory}/{DRAFT_FILE}: unknown format {meta.get('format')!r}, expected {FORMAT!r}")
    vocab_ids = load_vocab(directory)
    target = load_model(meta["target"], dtype=dtype, device=device, pack=False)  # packed once cut down, below
    model = target.model
    head_weight = model.get_output_embeddings().weight
    if (
        head_weight.shape[0] != meta["full_vocab"]
        or abs(_fingerprint(model, vocab_ids) - meta["fingerprint"]) > 1e-3 * abs(meta["fingerprint"]) + 1e-3
    ):
        raise ValueError(
            f"{directory}: target {meta['target']!r} is not the model this draft was built from (embedding differs)"
        )
    # The loaded target is ours alone: cut it in place rather than copying it.
    keep_first_layers(model, meta["num_layers"])
    _prune_head(model, head_weight, vocab_ids)
    weights = load_file(str(directory / WEIGHTS_FILE), device=str(head_weight.device))
    expected = set(trainable_names(model))
    if set(weights) != expected:
        raise ValueError(
            f"{directory}/{WEIGHTS_FILE}: weights {sorted(set(weights) ^ expected)[:4]} do not match the draft's layers"
        )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor.to(params[name].dtype))
    model.eval().requires_grad_(False)
    pack_weights(use_column_kernels(model))  # the trained layers and the pruned head are new weights
    return LoadedModel(
        model=model,
        tokenizer=target.tokenizer,
        name=str(directory),
        eos_token_ids=target.eos_token_ids,
        vocab_size=meta["full_vocab"],  # drafts are full-vocabulary ids, like the target's
        max_context=target.max_context,
        min_confidence=float(meta.get("min_confidence", 0.0)),
    )


def _portable(spec: str | None) -> str | None:
    """The embedded default stays None (portable); a directory or file becomes absolute."""
    if spec in (None, "default"):
        return None
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def _fingerprint(target: PreTrainedModel, vocab_ids: list[int]) -> float:
    rows = torch.tensor(vocab_ids[:_FINGERPRINT_ROWS], device=target.get_input_embeddings().weight.device)
    return float(target.get_input_embeddings().weight[rows].double().abs().sum())
