"""Linear layers computed the way the CPU is fast at: oneDNN's GEMM on a weight packed at load
time, and y = (W @ x^T)^T where packing is off or cannot serve.

A causal LM's last step maps each kept position's hidden state h (d) onto the vocabulary with
W (vocab x d): for Gemma 3 270M that is 262,144 x 640 fp32 (671 MB), most of a decode step.
With few rows the product is a read of W, and `W @ h^T` reads it faster than the kernels
`F.linear` picks for a handful of rows; one row is computed as a 2-column product of the row
with itself, as fast as two. The decoder layers' projections gain the same way.

oneDNN's GEMM on a weight packed once into its blocked layout (`torch.ops.mkldnn`, what
torch.compile uses on CPUs) is faster still: it keeps a verify pass of a few drafts close to
a decode step's cost, and that pass is most of what speculation costs on a CPU; from how many
rows it serves is `_PACKED_MIN_ROWS`. The figures are in docs/performance.md. The packed copy is
a second copy of each weight (the embedded target: 1.07 GB more), made at load time;
`SPECDEC_PACKED_LINEAR=0` turns it off.
Autograd (training) and other devices and dtypes use columns. Values differ from `F.linear` by
float rounding only.

`use_column_kernels(model)` switches every `nn.Linear` of a CPU model to this and `pack_weights`
packs them (loading does both: `specdec.runtime.models`); `forward_logits` runs the model's base
(the decoder stack) and projects only the kept rows; for architectures it does not know it falls
back to the model's own forward.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn
from transformers import PreTrainedModel

from specdec.core.errors import NonFiniteLogits

# Causal LMs whose forward is: base model -> keep rows -> lm_head (-> optional final softcap).
_KNOWN = {"llama", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "mistral", "qwen2", "qwen3", "phi3"}
HEAD_LABEL = "specdec.head"  # the output projection's range in a torch profile (bench/pass_profile.py)
_MAX_COLUMN_ROWS = 64  # beyond, F.linear's GEMM kernels are the better choice again
# From how many rows oneDNN's packed GEMM serves a layer (columns below). Which is faster at
# 1-2 rows depends on the machine (docs/performance.md); 3 gives those rows to the columns.
_PACKED_MIN_ROWS = 1
PACK_BATCH_HINT = 5  # rows oneDNN lays the packed weight out for: a verify pass with 4 drafts (a hint; any rows run)
# Outputs per packed slice of a weight. A vocabulary projection's product is made slice by slice
# (and its argmax reduced slice by slice): as fast as one product from 1 row and faster from a
# few (docs/performance.md); layers narrower than a slice are one.
VOCAB_SLICE = 32_768


def forward_logits(
    model: PreTrainedModel, keep: int | torch.Tensor, decoder: Callable | None = None, **inputs
) -> torch.Tensor:
    """`model(**inputs, logits_to_keep=keep).logits`, with the projection done by `project`.
    `keep`: the last `keep` positions, or a tensor of position indices. `decoder`: what runs in
    place of `model.base_model` (a compiled twin, `specdec.runtime.compiled`). Returns
    (B, kept, vocab)."""
    if not splits(model):
        return model(**inputs, logits_to_keep=keep).logits
    return head_logits(model, forward_hidden(model, keep, decoder, **inputs))


def splits(model: PreTrainedModel) -> bool:
    """The model's forward is base model -> kept rows -> a linear head (-> a final softcap), so
    `forward_hidden` and `head_logits` can run it in two parts."""
    head = model.get_output_embeddings()
    return model.config.model_type in _KNOWN and type(head) in (nn.Linear, _ColumnLinear)


def forward_hidden(
    model: PreTrainedModel, keep: int | torch.Tensor, decoder: Callable | None = None, **inputs
) -> torch.Tensor:
    """The final hidden states at the kept positions, (B, kept, d), of a model that `splits`."""
    hidden = (model.base_model if decoder is None else decoder)(**inputs).last_hidden_state  # (B, N, d)
    return hidden[:, -keep:] if isinstance(keep, int) else hidden[:, keep]


def head_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The logits of hidden states (..., d) from `forward_hidden`: (..., vocab)."""
    with torch.profiler.record_function(HEAD_LABEL):
        logits = project(model.get_output_embeddings(), hidden)
    softcap = final_softcap(model)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def final_softcap(model: PreTrainedModel) -> float | None:
    return getattr(model.config.get_text_config(), "final_logit_softcapping", None)


def project(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden) for hidden (..., d), the fastest way this module knows (see the docstring)."""
    return head(hidden) if isinstance(head, _ColumnLinear) else column_linear(hidden, head.weight, head.bias)


def column_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), computed as (W @ x^T)^T when x has 1..64 rows on a CPU."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or not 0 < rows <= _MAX_COLUMN_ROWS:
        return nn.functional.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = flat.repeat(2, 1)  # a contiguous copy: an expanded (stride 0) row takes a slow path
    elif not flat.is_contiguous():
        # This function's own outputs are transposed views, and so are elementwise products of
        # them (an MLP's act(gate) * up): with x^T contiguous the GEMM takes a much slower path.
        flat = flat.contiguous()
    out = (weight @ flat.T).T[:rows]  # (rows, out), a transposed view: no copy
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


class _ColumnLinear(nn.Linear):
    """nn.Linear whose forward is oneDNN's packed GEMM or `column_linear`: same parameters, same
    state dict. The packed copy is made at load time (`pack_weights`), else at the first forward
    that uses it, and again whenever the weight changed (its version counter or storage), so
    loading trained weights into a module later (a pruned draft's layers) is never served stale."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return nn.functional.linear(x, self.weight, self.bias)  # inductor chooses its own GEMMs
        rows = x.numel() // x.shape[-1]
        # A mismatched x goes to column_linear too, whose error names the shapes (oneDNN's does not).
        if rows >= _PACKED_MIN_ROWS and x.shape[-1] == self.in_features and _packable(x, self.weight):
            slices = self._packed_weight()
            if slices is not None:
                flat = x.reshape(rows, x.shape[-1]).contiguous()
                parts = [self._slice_product(flat, start, packed) for start, packed in slices]
                out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                return out.reshape(*x.shape[:-1], out.shape[-1])
        return column_linear(x, self.weight, self.bias)

    def argmax(self, x: torch.Tensor, softcap: float | None = None) -> torch.Tensor | None:
        """(rows,) argmax of this layer's output for x (rows, in_features), ties to the lowest
        index as `torch.argmax` breaks them, computed a slice of outputs at a time (`VOCAB_SLICE`:
        a slice's products are reduced while in cache, and the rows x out_features product is never
        held). With `softcap`, of the capped outputs tanh(y / cap) * cap: elementwise, so each
        slice's capped values are bitwise the whole product's, and ties the cap makes (saturated
        outputs) go to the lowest index as they would there. None where the packed path does not
        serve x. A row whose outputs hold a NaN or an infinity has no argmax to give:
        `NonFiniteLogits` names those rows."""
        slices = self._packed_weight() if _packable(x, self.weight) and x.shape[-1] == self.in_features else None
        if slices is None:
            return None
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        best = index = None
        nan = torch.zeros(flat.shape[0], dtype=torch.bool)
        for start, packed in slices:
            product = self._slice_product(flat, start, packed)
            if softcap is not None:
                product = torch.tanh(product / softcap) * softcap  # as `head_logits` caps them
            value, at = product.max(dim=-1)  # the first maximum of the slice
            nan |= value.isnan()
            if best is None:
                best, index = value, at + start
            else:
                later = value > best  # strict: on a tie the earlier slice's (lower) index stays
                best, index = torch.where(later, value, best), torch.where(later, at + start, index)
        bad = nan | ~best.isfinite()
        if bool(bad.any()):
            raise NonFiniteLogits(torch.nonzero(bad).flatten().tolist())
        return index

    def _slice_product(self, flat: torch.Tensor, start: int, packed: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias[start : start + VOCAB_SLICE]
        return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")

    def _packed_weight(self) -> list[tuple[int, torch.Tensor]] | None:
        """The weight packed in slices of `VOCAB_SLICE` outputs, each with its first output's
        index (one slice for any layer but a vocabulary projection)."""
        key = (self.weight.data_ptr(), self.weight._version, self.weight.shape, VOCAB_SLICE)
        cached = self.__dict__.get("_packed")  # not a buffer: no state dict entry, never moved by .to()
        if cached is None or cached[0] != key:
            weight = self.weight.detach()
            try:
                slices = [
                    (
                        start,
                        torch.ops.mkldnn._reorder_linear_weight(weight[start : start + VOCAB_SLICE], PACK_BATCH_HINT),
                    )
                    for start in range(0, weight.shape[0], VOCAB_SLICE)
                ]
            except (RuntimeError, AttributeError):  # a build without oneDNN: columns it is
                slices = None
            cached = (key, slices)
            self.__dict__["_packed"] = cached
        return cached[1]

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight behind (an opaque oneDNN tensor; the copy
        packs its own at its first forward)."""
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        return state


def _packable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """oneDNN's packed path serves this product: fp32 on a CPU, no gradient wanted, not turned off."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False  # training: autograd goes through column_linear
    return _weight_packable(weight)


def _weight_packable(weight: torch.Tensor) -> bool:
    return (
        _PACKED_ENABLED
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


def pack_weights(model: nn.Module) -> nn.Module:
    """Make every packed copy now rather than at its first use: packing the 262,144 x 640 output
    projection costs many passes' worth of time, and a verify pass that paid it would teach the
    coordinator's cost model that drafting 2+ tokens costs that much (and keep its k at 1)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, _ColumnLinear) and _weight_packable(module.weight):
                module._packed_weight()
    return model


_PACKED_ENABLED = os.environ.get("SPECDEC_PACKED_LINEAR", "1") != "0"


def use_column_kernels(model: nn.Module) -> nn.Module:
    """Switch every plain nn.Linear of `model` to `column_linear`, in place (a no-op off the CPU,
    where column_linear is F.linear)."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = _ColumnLinear
    return model
