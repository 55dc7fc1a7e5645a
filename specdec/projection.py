"""Linear layers computed the way the CPU is fast at: y = (W @ x^T)^T, for up to 64 rows of x.

A causal LM's last step maps each kept position's hidden state h (d) onto the vocabulary with
W (vocab x d). For Gemma 3 270M that is 262,144 x 640 fp32 (671 MB), most of a decode step. On
this CPU, `F.linear(h, W)` with 2-9 rows of h picks a kernel that takes 105-150 ms, while the
same product as `W @ h^T` takes 32-78 ms; and one row, which `F.linear` gives to a
matrix-vector kernel (45-50 ms), is faster as a 2-column product of the row with itself
(32 ms). The decoder layers' own projections (640 x 2048 and smaller) gain the same way with a
few rows: a 2-token pass of the 18 layers took 66-68 ms with `F.linear` and 54-56 ms as
columns (measured on 2 cores, torch 2.13, cache of 100 tokens). So a verify pass over k + 1
positions, most of what speculation costs over a decode step, costs less, and so does the
decode step itself. Values differ from `F.linear` by float rounding only.

`use_column_kernels(model)` switches every `nn.Linear` of a CPU model to this (loading does it:
`specdec.models`); `forward_logits` runs the model's base (the decoder stack) and projects only
the kept rows; for architectures it does not know it falls back to the model's own forward.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

# Causal LMs whose forward is: base model -> keep rows -> lm_head (-> optional final softcap).
_KNOWN = {"llama", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "mistral", "qwen2", "qwen3", "phi3"}
_MAX_COLUMN_ROWS = 64  # beyond, F.linear's GEMM kernels are the better choice again


def forward_logits(model: PreTrainedModel, keep: int | torch.Tensor, **inputs) -> torch.Tensor:
    """`model(**inputs, logits_to_keep=keep).logits`, with the projection done by `project`.
    `keep`: the last `keep` positions, or a tensor of position indices. Returns (B, kept, vocab)."""
    head = model.get_output_embeddings()
    if model.config.model_type not in _KNOWN or type(head) not in (nn.Linear, _ColumnLinear):
        return model(**inputs, logits_to_keep=keep).logits
    hidden = model.base_model(**inputs).last_hidden_state  # (B, N, d)
    hidden = hidden[:, -keep:] if isinstance(keep, int) else hidden[:, keep]
    logits = project(head, hidden)
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def project(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden) for hidden (..., d): as W @ h^T on a CPU for up to 64 rows, else F.linear."""
    return column_linear(hidden, head.weight, head.bias)


def column_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), computed as (W @ x^T)^T when x has 1..64 rows on a CPU."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or not 0 < rows <= _MAX_COLUMN_ROWS:
        return nn.functional.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = flat.repeat(2, 1)  # a contiguous copy: an expanded (stride 0) row takes a slow path
    out = (weight @ flat.T).T[:rows]  # (rows, out), a transposed view: no copy
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


class _ColumnLinear(nn.Linear):
    """nn.Linear whose forward is `column_linear`: same parameters, same state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_linear(x, self.weight, self.bias)


def use_column_kernels(model: nn.Module) -> nn.Module:
    """Switch every plain nn.Linear of `model` to `column_linear`, in place (a no-op off the CPU,
    where column_linear is F.linear)."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = _ColumnLinear
    return model
