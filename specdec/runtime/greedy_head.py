"""The exact argmax of the output projection, read through a bf16 copy of its weight.

Greedy decoding needs only argmax_j z_j with z = W h (W: vocab x d; the embedded target's is
262,144 x 640, most of a decode pass on a CPU, where reading W is the cost). The screen reads a
bf16 copy of W (half the bytes; oneDNN's packed bf16 GEMM), which gives z'_j with a bounded error,
then recomputes in fp32 only the tokens that could still be the argmax. With z~ the screen's
fp32 accumulation before its bf16 output z', and r = c ||h|| max_j ||w_j|| where
c = 2u + u^2 + 3 d 2^-24 (h and w_j each rounded to bf16 with unit roundoff u = 2^-8, the fp32
accumulations over d terms of the screen and of the recomputation; ||h|| ||w_j|| bounds
sum_i |h_i w_ji| by Cauchy-Schwarz): |z~_j - z_j| <= r and |z'_j - z~_j| <= u |z~_j|. Rounding
is monotone, so a token whose recomputed logit can reach the screen's argmax a has
z'_j >= max z' - 2e, with e = (r + u |z'_a|) / (1 - 2u). Every such token is recomputed
exactly (a few a row on real text); the argmax over them is the argmax over all,
ties to the lowest id as `torch.argmax` breaks them. The result equals the argmax of the full
fp32 product up to fp32 rounding, as one batch composition's product equals another's.

Sampling needs every probability and keeps the full fp32 projection (`specdec.runtime.projection`).
"""

from __future__ import annotations

import platform

import torch
from torch import nn

from specdec.core.errors import NonFiniteLogits
from specdec.runtime.projection import HEAD_LABEL, PACK_BATCH_HINT

_U = 2.0**-8  # bf16 unit roundoff (8 bits of precision)
_MAX_CANDIDATES = 1 << 16  # recomputed positions per pass beyond which the full product is cheaper
_BLOCK = 64  # tokens a block of the screen's logits, searched for candidates only past its max


def native_bf16_gemm() -> bool:
    """oneDNN's bf16 GEMM runs on bf16 instructions here. On x86 oneDNN also serves bf16 on plain
    AVX-512 by converting to fp32 (`_is_mkldnn_bf16_supported` says yes there): that screen reads
    half the bytes but is slower than the fp32 product from 2 rows up (docs/performance.md), so x86
    needs AVX-512 BF16 or AMX. Elsewhere (Arm) oneDNN answers yes only with the BF16 extension."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return True


class GreedyHead:
    """Screened exact argmax for an `nn.Linear` output projection on a CPU, fp32."""

    def __init__(self, head: nn.Linear):
        weight = head.weight.detach()  # (vocab, d)
        self.weight = weight
        self.bias = None if head.bias is None else head.bias.detach()
        # oneDNN's packed bf16 GEMM where the CPU has one; elsewhere torch's own bf16 GEMM, which
        # also accumulates in fp32 and rounds once (the bound below holds for both), but runs slower
        # than the fp32 product: `supported` keeps the verifier off it there.
        bf16 = weight.to(torch.bfloat16)
        fast = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(bf16, PACK_BATCH_HINT) if fast else None
        self.bf16 = None if fast else bf16
        self.max_norm = weight.norm(dim=1).max().item()
        d = weight.shape[1]
        self.c = (2 * _U + _U * _U + 3 * d * 2.0**-24) * 1.01  # 1 % on top for the norms' own rounding

    @staticmethod
    def supported(head: nn.Module) -> bool:
        """A plain fp32 linear layer on a CPU with bf16 instructions: where the screen is faster
        than the full product (it is exact on any CPU)."""
        weight = getattr(head, "weight", None)
        return (
            isinstance(head, nn.Linear)
            and weight is not None
            and weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and native_bf16_gemm()
        )

    @torch.inference_mode()
    def argmax(self, hidden: torch.Tensor, project) -> torch.Tensor:
        """(rows,) argmax of W h + b for hidden (rows, d). `project`: the full fp32 projection,
        used when too many tokens survive the screen."""
        with torch.profiler.record_function(HEAD_LABEL):
            return self._argmax(hidden, project)

    def _argmax(self, hidden: torch.Tensor, project) -> torch.Tensor:
        h16 = hidden.to(torch.bfloat16).contiguous()
        if self.packed is not None:
            approx = torch.ops.mkldnn._linear_pointwise(h16, self.packed, None, "none", [], "")  # (rows, vocab)
        else:
            approx = torch.nn.functional.linear(h16, self.bf16)  # (rows, vocab), bf16
        if self.bias is not None:
            approx = approx.float() + self.bias
        # The screen's maxima by blocks of _BLOCK tokens: a token within 2e of the row's max lies
        # in a block whose max is, so only those blocks are searched (one pass over the logits,
        # not a mask of them all).
        n, vocab = approx.shape
        block = _BLOCK if vocab % _BLOCK == 0 else vocab
        blocks = approx.view(n, vocab // block, block)
        block_max = blocks.amax(dim=2)  # (rows, blocks)
        high = block_max.amax(dim=1).float()  # (rows,) max_j z'_j
        # r bounds the rounding of h and W and both accumulations; the bf16 output adds u |z'_j|,
        # and for every token that matters (z'_j within 2e of the max) |z'_j| <= |high| + 2e,
        # hence e = (r + u |high|) / (1 - 2u) (module docstring).
        r = self.c * hidden.norm(dim=1) * self.max_norm
        e = (r + _U * high.abs()) / (1 - 2 * _U)
        floor = high - 2 * e  # (rows,)
        block_rows, block_ids = torch.nonzero(block_max >= floor.unsqueeze(1), as_tuple=True)
        inside, offsets = torch.nonzero(blocks[block_rows, block_ids] >= floor[block_rows].unsqueeze(1), as_tuple=True)
        rows, cols = block_rows[inside], block_ids[inside] * block + offsets
        if rows.numel() > _MAX_CANDIDATES:
            return torch.argmax(project(hidden), dim=-1)
        exact = (hidden[rows] * self.weight[cols]).sum(-1)  # (candidates,)
        if self.bias is not None:
            exact += self.bias[cols]
        best = torch.full((n,), float("-inf"), dtype=exact.dtype).scatter_reduce(0, rows, exact, "amax")
        tied = exact == best[rows]
        # The lowest id among a row's best, as torch.argmax breaks ties.
        first = torch.full((n,), self.weight.shape[0], dtype=cols.dtype)
        first = first.scatter_reduce(0, rows[tied], cols[tied], "amin")
        # A NaN or an infinity in a row's logits makes its floor NaN (inf - inf) and leaves it with
        # no candidate: its id would stay `vocab`, one past the last token. Such a row has no
        # argmax to give, so the pass fails with the rows named (a host read, free on the CPU).
        empty = first == self.weight.shape[0]
        if bool(empty.any()):
            raise NonFiniteLogits(torch.nonzero(empty).flatten().tolist())
        return first
