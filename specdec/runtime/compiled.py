"""`torch.compile` for decode-shaped passes, behind the target tier's `--compile` flag.

A decode-shaped pass is one whose every row feeds at most a verify round's tokens (decode and
verify rows, no prefill chunk): its packed length T is small and recurs, which is where launch
overhead and unfused elementwise kernels cost most. Such a pass runs the model's decoder through
a compiled module; prefill passes stay eager.

Compilation is piecewise, as vLLM's is: paged attention (Python over the pass layout, index
reads of the pool) stays eager, so the compiled graphs are the pieces between attentions (norms,
projections, rotary embedding, MLP), whose only varying shape is T. They are compiled once with T
dynamic (plus T = 1, which torch specialises): a new batch composition never recompiles them.

Modes (`COMPILE_MODES`):
- "off": eager, the default;
- "inductor": `torch.compile` with inductor's default mode (fused kernels; on a CPU its own GEMMs
  in place of the packed oneDNN ones, see `specdec.runtime.projection`);
- "cudagraphs": inductor with CUDA graphs (`mode="reduce-overhead"`): each piece replays a graph
  recorded at its first pass of each T. CUDA only.

Numerics: a compiled piece may sum in another order than eager, so a logit can differ in its last
bits between a compiled and an eager pass, as between two batch compositions. Greedy equality of
speculative and target-only output holds as it does eagerly (docs/performance.md, "Greedy
equality on GPUs"); the fp32 tests check it with compilation on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface, PreTrainedModel

COMPILE_MODES = ("off", "inductor", "cudagraphs")  # the target tier's --compile
_TORCH_MODE = {"inductor": "default", "cudagraphs": "reduce-overhead"}

Decoder = Callable[..., object]  # the model's base model: inputs -> an output with last_hidden_state


def compile_decoder(model: PreTrainedModel, mode: str, attention: str) -> Decoder | None:
    """A compiled twin of `model.base_model` for decode-shaped passes, or None for "off".
    `attention`: the registered attention implementation the model runs (it stays eager)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {mode!r}: expected one of {', '.join(COMPILE_MODES)}")
    if mode == "off":
        return None
    device = next(model.parameters()).device
    if mode == "cudagraphs" and device.type != "cuda":
        raise ValueError(f"compile mode 'cudagraphs' needs a CUDA device; the model is on {device}")
    _keep_attention_eager(attention)
    return torch.compile(model.base_model, dynamic=True, mode=_TORCH_MODE[mode])


def _keep_attention_eager(name: str) -> None:
    """Re-register attention `name` as a function dynamo calls rather than traces (a graph break:
    the pieces between attentions are the compiled graphs). Idempotent."""
    function = AttentionInterface._global_mapping[name]
    if not getattr(function, "_specdec_eager", False):
        eager = torch.compiler.disable(function)
        eager._specdec_eager = True
        AttentionInterface.register(name, eager)
