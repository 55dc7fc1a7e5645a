"""The output projection, computed the way the CPU is fast at: logits = (W @ h^T)^T.

A causal LM's last step maps each kept position's hidden state h (d) onto the vocabulary with
W (vocab x d). For Gemma 3 270M that is 262,144 x 640 fp32 (671 MB), most of a decode step. On
this CPU, `F.linear(h, W)` with 2-9 rows of h picks a kernel that takes 137-352 ms, while the
same product as `W @ h^T` takes 92-129 ms (one row: 57 ms either way; measured on 2 cores,
torch 2.13). A verify pass keeps k + 1 rows, so this is most of what speculation costs over a
plain decode step. Values differ from `F.linear` by float rounding only (6e-5 at most there).

`forward_logits` runs the model's base (the decoder stack) and projects only the kept rows; for
architectures it does not know it falls back to the model's own forward.
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
    if model.config.model_type not in _KNOWN or type(head) is not nn.Linear:
        return model(**inputs, logits_to_keep=keep).logits
    hidden = model.base_model(**inputs).last_hidden_state  # (B, N, d)
    hidden = hidden[:, -keep:] if isinstance(keep, int) else hidden[:, keep]
    logits = project(head, hidden)
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def project(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden) for hidden (..., d): as W @ h^T on a CPU for a few rows, else F.linear."""
    rows = hidden.numel() // hidden.shape[-1]
    if hidden.device.type != "cpu" or not 1 < rows <= _MAX_COLUMN_ROWS:
        return head(hidden)
    flat = hidden.reshape(rows, hidden.shape[-1])
    logits = (head.weight @ flat.T).T  # (rows, vocab), a transposed view: no copy
    if head.bias is not None:
        logits = logits + head.bias
    return logits.reshape(*hidden.shape[:-1], logits.shape[-1])
