"""Gemma 3's decoder written for the paged pass: the same arithmetic as transformers' modules,
without their per-call machinery, and with the projections that read one input fused.

A ragged pass (`specdec.runtime.ragged`) over Gemma 3 through transformers' modules pays, per
layer, the modules' Python (kwargs, decorators, output records), six RMSNorms of five kernels
each, a rotary embedding of seven, and five separate GEMMs over the same activations. Here each
layer is a few tensor calls on the packed (T, d) activations:

- q, k and v are one GEMM over a weight [W_q; W_k; W_v], and gate and up one over [W_gate;
  W_up] (as vLLM's QKVParallelLinear and MergedColumnParallelLinear): each fused weight is one
  storage, and the modules' own weights become views into it, so the model's parameters, its
  state dict and every other forward are unchanged, and no memory is added;
- each RMSNorm is one `F.rms_norm` with the weight (1 + w) made once: Gemma's x * rsqrt(mean(x^2)
  + eps) * (1 + w), in fp32 as transformers computes it;
- the rotary embedding rotates the two halves of each head with the cos and sin of the pass's
  positions, made once a pass for each layer type: q1 c - q2 s and q2 c + q1 s, the products
  and sums transformers' q cos + rotate_half(q) sin makes;
- attention is the pass's paged attention (`PassLayout.attend`) on (T, heads, head_dim) tensors.

Outputs equal the modules' up to float rounding (the fused GEMMs may block their sums
differently), as one batch composition's equal another's; tests check the logits against a plain
forward and greedy output against target-only decoding.

`paged_decoder(model)` gives the decoder for a model it serves (Gemma 3 text models whose rotary
embedding is fixed at load time; None for any other, which runs transformers' modules), made once
per model. `SPECDEC_PAGED_DECODER=0` turns it off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from specdec.runtime.projection import pack_weights, use_column_kernels

_ENABLED = os.environ.get("SPECDEC_PAGED_DECODER", "1") != "0"
_STATIC_ROPE = {"default", "linear"}  # rope types whose inverse frequencies are fixed at load time
_ATTR = "_specdec_paged_decoder"
_LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def paged_decoder(model: PreTrainedModel):
    """The paged decoder of `model` (made at the first call, then kept on the model, and made again
    if the model's layers were cut since), or None when it does not serve this model."""
    made = model.__dict__.get(_ATTR)
    if _ATTR not in model.__dict__ or (made is not None and len(made.layers) != len(model.base_model.layers)):
        # Outside inference mode: the fused weights are parameters' storage, which any later
        # forward (and oneDNN's packing, by its version counter) must be able to use.
        with torch.inference_mode(False), torch.no_grad():
            model.__dict__[_ATTR] = PagedGemma3(model.base_model) if _ENABLED and serves(model) else None
    return model.__dict__[_ATTR]


def decoder_name(model: PreTrainedModel) -> str:
    """Which decoder runs `model`'s paged passes: "fused" (this module's) or "transformers" (the
    model's own modules, exact for any family, slower)."""
    return "fused" if paged_decoder(model) is not None else "transformers"


def serves(model: PreTrainedModel) -> bool:
    """A Gemma 3 text model this decoder computes exactly as transformers does."""
    config = model.config
    if config.model_type != "gemma3_text" or type(model.base_model).__name__ != "Gemma3TextModel":
        return False
    rope = getattr(model.base_model.rotary_emb, "rope_type", {})
    return (
        config.hidden_activation == "gelu_pytorch_tanh"
        and not config.attention_bias
        and not config.attn_logit_softcapping
        and not config.use_bidirectional_attention
        and all(kind in _STATIC_ROPE for kind in rope.values())
        and set(rope) == set(config.layer_types)
    )


@dataclass
class _Layer:
    qkv: nn.Linear  # [W_q; W_k; W_v]
    gate_up: nn.Linear  # [W_gate; W_up]
    o: nn.Linear
    down: nn.Linear
    norms: dict[str, tuple[torch.Tensor, float]]  # name -> ((1 + w), eps)
    kind: str  # "sliding_attention" or "full_attention"
    window: int | None
    index: int


class PagedGemma3:
    """Called as the model's base model in a paged pass (`forward_hidden`): input_ids and
    position_ids (1, T), the pass layout; returns the final hidden states (1, T, d)."""

    def __init__(self, base: nn.Module):
        config = base.config
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = config.query_pre_attn_scalar**-0.5
        self.final_norm = _norm(base.norm)
        self.layers = [self._layer(i, layer) for i, layer in enumerate(base.layers)]

    def _layer(self, index: int, layer: nn.Module) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        norms = {name: _norm(getattr(layer, name)) for name in _LAYER_NORMS}
        norms["q"], norms["k"] = _norm(attention.q_norm), _norm(attention.k_norm)
        return _Layer(
            qkv=_fuse(attention.q_proj, attention.k_proj, attention.v_proj),
            gate_up=_fuse(mlp.gate_proj, mlp.up_proj),
            o=attention.o_proj,
            down=mlp.down_proj,
            norms=norms,
            kind=attention.layer_type,
            window=attention.sliding_window,
            index=index,
        )

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, specdec_pass, **_) -> BaseModelOutput:
        hidden = self.embed(input_ids[0])  # (T, d), the embedding's scale included
        rotations = {kind: self._rotation(position_ids[0], kind) for kind in {layer.kind for layer in self.layers}}
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for layer in self.layers:
            residual = hidden
            x = _rms(hidden, layer.norms["input_layernorm"])
            qkv = layer.qkv(x)  # (T, q + 2 kv)
            q = qkv[:, :q_width].view(-1, self.heads, self.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(-1, self.kv_heads, self.head_dim)
            v = qkv[:, q_width + kv_width :].view(-1, self.kv_heads, self.head_dim)
            cos, sin = rotations[layer.kind]
            q = _rotate(_rms(q, layer.norms["q"]), cos, sin)
            k = _rotate(_rms(k, layer.norms["k"]), cos, sin)
            attended = specdec_pass.attend(layer.index, q, k, v, self.scaling, layer.window)
            x = layer.o(attended.reshape(attended.shape[0], -1))
            hidden = residual + _rms(x, layer.norms["post_attention_layernorm"])
            residual = hidden
            x = layer.gate_up(_rms(hidden, layer.norms["pre_feedforward_layernorm"]))
            gate, up = x.chunk(2, dim=-1)
            x = layer.down(F.gelu(gate, approximate="tanh") * up)
            hidden = residual + _rms(x, layer.norms["post_feedforward_layernorm"])
        return BaseModelOutput(last_hidden_state=_rms(hidden, self.final_norm).unsqueeze(0))

    def _rotation(self, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each position's angles, (T, 1, head_dim / 2), as transformers' rotary
        embedding computes them (in fp32, times the rope type's attention scaling)."""
        inv_freq = getattr(self.rotary, f"{kind}_inv_freq")
        scaling = getattr(self.rotary, f"{kind}_attention_scaling")
        angles = positions[:, None].float() * inv_freq.float()  # (T, head_dim / 2)
        dtype = self.embed.weight.dtype
        return (angles.cos() * scaling).to(dtype).unsqueeze(1), (angles.sin() * scaling).to(dtype).unsqueeze(1)


def _norm(module: nn.Module) -> tuple[torch.Tensor, float]:
    """A Gemma RMSNorm's (1 + w) in fp32, made once, and its eps."""
    return 1.0 + module.weight.detach().float(), module.eps


def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """Gemma's RMSNorm: normalised and scaled in fp32, then cast back (a no-op in fp32)."""
    weight, eps = norm
    return F.rms_norm(x.float(), weight.shape, weight, eps).type_as(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (T, heads, head_dim) by halves: [x1 c - x2 s, x2 c + x1 s]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _fuse(*linears: nn.Linear) -> nn.Linear:
    """One linear layer computing `linears` (without biases: Gemma 3 has none) side by side over
    the same input: its weight is the rows of theirs stacked, and theirs become views into it (no
    copy stays behind)."""
    first = linears[0].weight
    stacked = torch.cat([linear.weight.detach() for linear in linears])
    fused = nn.Linear(first.shape[1], stacked.shape[0], bias=False, device="meta")
    fused.weight = nn.Parameter(stacked, requires_grad=False)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = stacked[start : start + rows]
        linear.__dict__.pop("_packed", None)  # its packed copy, if any: the fused one serves
        start += rows
    return pack_weights(use_column_kernels(fused))
