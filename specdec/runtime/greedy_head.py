"""The exact argmax of the output projection, read through a bf16 copy of its weight.

Greedy decoding needs only argmax_j z_j with z = W h (W: vocab x d; the embedded target's is
262,144 x 640, most of a decode pass on a CPU, where reading W is the cost). The screen reads a
bf16 copy of W (half the bytes; oneDNN's packed bf16 GEMM), which gives z'_j with a bounded error,
then recomputes in fp32 only the tokens that could still be the argmax:

  |z'_j - z_j| <= e_j <= c * ||h|| * max_j ||w_j|| + u * max_j |z'_j| = e

with u = 2^-8 the bf16 unit roundoff and c = 2u + u^2 + 2 d 2^-24 (h and w_j each rounded to
bf16, fp32 accumulation over d terms in the screen and in the recomputation; ||h|| ||w_j||
bounds sum_i |h_i w_ji| by Cauchy-Schwarz), and the u |z'_j| term for the bf16 output. Every token
whose z'_j reaches max_i z'_i - 2e is recomputed exactly (a few rows of W); the argmax over them
is the argmax over all, ties to the lowest id as `torch.argmax` breaks them. The
result equals the argmax of the full fp32 product up to fp32 rounding, as one batch composition's
product equals another's.

Sampling needs every probability and keeps the full fp32 projection (`specdec.runtime.projection`).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.runtime.projection import HEAD_LABEL

_U = 2.0**-8  # bf16 unit roundoff (8 bits of precision)
_MAX_CANDIDATES = 1 << 16  # recomputed positions per pass beyond which the full product is cheaper
_PACK_BATCH_HINT = 5


class GreedyHead:
    """Screened exact argmax for an `nn.Linear` output projection on a CPU, fp32."""

    def __init__(self, head: nn.Linear):
        weight = head.weight.detach()  # (vocab, d)
        self.weight = weight
        self.bias = None if head.bias is None else head.bias.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), _PACK_BATCH_HINT)
        self.max_norm = weight.norm(dim=1).max().item()
        d = weight.shape[1]
        self.c = (2 * _U + _U * _U + 2 * d * 2.0**-24) * 1.01  # 1 % on top for the norms' own rounding

    @staticmethod
    def supported(head: nn.Module) -> bool:
        """A plain fp32 linear layer on a CPU whose oneDNN build has a bf16 GEMM."""
        weight = getattr(head, "weight", None)
        return (
            isinstance(head, nn.Linear)
            and weight is not None
            and weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )

    @torch.inference_mode()
    def argmax(self, hidden: torch.Tensor, project) -> torch.Tensor:
        """(rows,) argmax of W h + b for hidden (rows, d). `project`: the full fp32 projection,
        used when too many tokens survive the screen."""
        with torch.profiler.record_function(HEAD_LABEL):
            return self._argmax(hidden, project)

    def _argmax(self, hidden: torch.Tensor, project) -> torch.Tensor:
        approx = torch.ops.mkldnn._linear_pointwise(
            hidden.to(torch.bfloat16).contiguous(), self.packed, None, "none", [], ""
        )  # (rows, vocab), bf16
        if self.bias is not None:
            approx = approx.float() + self.bias
        low, high = torch.aminmax(approx, dim=1)  # (rows,) each
        # One bound for the whole row: e_j <= c ||h|| max_j ||w_j|| + u max_j |z'_j|. The argmax
        # a of z' and the true argmax t satisfy z'_t + e_t >= z_t >= z_a >= z'_a - e_a, so t is
        # among the tokens with z'_j >= max z' - 2 e.
        bound = self.c * hidden.norm(dim=1) * self.max_norm + _U * torch.maximum(low.abs(), high.abs()).float()
        rows, cols = torch.nonzero(approx >= (high.float() - 2 * bound).unsqueeze(1), as_tuple=True)
        if rows.numel() > _MAX_CANDIDATES:
            return torch.argmax(project(hidden), dim=-1)
        exact = (hidden[rows] * self.weight[cols]).sum(-1)  # (candidates,)
        if self.bias is not None:
            exact += self.bias[cols]
        n = hidden.shape[0]
        best = torch.full((n,), float("-inf"), dtype=exact.dtype).scatter_reduce(0, rows, exact, "amax")
        tied = exact == best[rows]
        # The lowest id among a row's best, as torch.argmax breaks ties.
        first = torch.full((n,), self.weight.shape[0], dtype=cols.dtype)
        return first.scatter_reduce(0, rows[tied], cols[tied], "amin")
