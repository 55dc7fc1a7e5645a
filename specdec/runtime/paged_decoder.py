"""One decoder written for the paged pass, driven by the model's config and modules, for the
families whose layers share one shape (Gemma 2 and 3, Llama, Mistral, Qwen 2 and 3, Phi-3): the
same arithmetic as transformers' modules, without their per-call machinery, and with the
projections that read one input fused.

A ragged pass (`specdec.runtime.ragged`) through transformers' modules pays, per layer, the
modules' Python (kwargs, decorators, output records), RMSNorms of five kernels each, a rotary
embedding of seven, and separate GEMMs over the same activations. Here each layer is a few
tensor calls on the packed (T, d) activations. What differs by family is read from the modules:
Gemma's RMSNorm scales by (1 + w) and sandwiches attention and the MLP between two norms each,
Llama's scales by w with one norm before each; Gemma 3 and Qwen 3 normalise q and k per head;
Qwen 2 biases q, k and v; Gemma 2 soft-caps attention logits; each layer's window and the
attention scaling are its module's; the MLP's activation is its own.

- q, k and v are one GEMM over a weight [W_q; W_k; W_v], and gate and up one over [W_gate;
  W_up] (as vLLM's QKVParallelLinear and MergedColumnParallelLinear): each fused weight is one
  storage, and the modules' own weights become views into it, so the model's parameters, its
  state dict and every other forward are unchanged, and no memory is added (Phi-3 stores them
  fused already);
- each RMSNorm is one `F.rms_norm` with its weight made once (Gemma's (1 + w)): x * rsqrt(mean(x^2)
  + eps) * w in fp32, as transformers computes it;
- the rotary embedding rotates the two halves of each head's rotary dims (all, or Phi's leading
  part) with the cos and sin of the pass's positions, made once a pass (for Gemma 3, once for
  each layer type; for longrope, per row (`_Longrope`); for the others by the model's own rotary
  module, so Llama 3's scaling is its): q1 c - q2 s and q2 c + q1 s, the products and sums
  transformers' q cos + rotate_half(q) sin makes;
- attention is the pass's paged attention (`PassLayout.attend`) on (T, heads, head_dim) tensors.

Outputs equal the modules' up to float rounding (the fused GEMMs may block their sums
differently), as one batch composition's equal another's; tests check the logits against a plain
forward and greedy output against target-only decoding.

`paged_decoder(model)` gives the decoder for a model it serves (`serves`: those families, with a
rope fixed at load time or longrope; None for any other, which runs transformers' modules), made
once per model. `SPECDEC_PAGED_DECODER=0` turns it off.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from specdec.runtime.projection import pack_weights, use_column_kernels

log = logging.getLogger(__name__)
_ENABLED = os.environ.get("SPECDEC_PAGED_DECODER", "1") != "0"
_STATIC_ROPE = {"default", "linear", "llama3"}  # rope types whose inverse frequencies are fixed at load time
_ROPES = (*sorted(_STATIC_ROPE), "longrope")  # longrope: one of two fixed sets, chosen per row (`_Longrope`)
_ATTR = "_specdec_paged_decoder"
_SANDWICH = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


@dataclass(frozen=True)
class _Family:
    """How a family's layer is built; each is norm -> attention -> residual -> norm -> MLP ->
    residual over the modules named here."""

    gemma: bool  # RMSNorm scales by (1 + w), and a norm follows attention and the MLP too
    qkv: tuple[str, ...]  # the attention's projections of its input, fused here where several
    gate_up: tuple[str, ...]  # the MLP's, likewise
    act: str  # the MLP's activation module


_GEMMA = _Family(True, ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), "act_fn")
_LLAMA = _Family(False, ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), "act_fn")
_LAYERS = {  # the decoder layers served, by class
    "Gemma2DecoderLayer": _GEMMA,
    "Gemma3DecoderLayer": _GEMMA,
    "LlamaDecoderLayer": _LLAMA,
    "MistralDecoderLayer": _LLAMA,
    "Qwen2DecoderLayer": _LLAMA,
    "Qwen3DecoderLayer": _LLAMA,
    "Phi3DecoderLayer": _Family(False, ("qkv_proj",), ("gate_up_proj",), "activation_fn"),  # stored fused
}


def paged_decoder(model: PreTrainedModel):
    """The paged decoder of `model` (made at the first call, then kept on the model, and made again
    if the model's layers were cut since), or None when it does not serve this model."""
    made = model.__dict__.get(_ATTR)
    if _ATTR not in model.__dict__ or (made is not None and len(made.layers) != len(model.base_model.layers)):
        # Outside inference mode: the fused weights are parameters' storage, which any later
        # forward (and oneDNN's packing, by its version counter) must be able to use.
        reason = unserved(model) if _ENABLED else "SPECDEC_PAGED_DECODER=0"
        if reason is not None and _ATTR not in model.__dict__:
            log.warning("%s runs on transformers' modules (exact, slower): %s", model.config.model_type, reason)
        with torch.inference_mode(False), torch.no_grad():
            model.__dict__[_ATTR] = PagedDecoder(model.base_model) if reason is None else None
    return model.__dict__[_ATTR]


def decoder_name(model: PreTrainedModel) -> str:
    """Which decoder runs `model`'s paged passes: "fused" (this module's) or "transformers" (the
    model's own modules, exact for any family, slower)."""
    return "fused" if paged_decoder(model) is not None else "transformers"


def serves(model: PreTrainedModel) -> bool:
    """A model whose every layer this decoder computes exactly as transformers does."""
    return unserved(model) is None


def unserved(model: PreTrainedModel) -> str | None:
    """Why this decoder does not serve `model` (None: it does), in words for the log."""
    base = getattr(model, "base_model", None)
    layers = getattr(base, "layers", None)
    kinds = {type(layer).__name__ for layer in layers} if layers else set()
    if not kinds or kinds - set(_LAYERS) or len(kinds) != 1:
        return f"its layers ({', '.join(sorted(kinds)) or 'none found'}) are not one of {', '.join(_LAYERS)}"
    if getattr(model.config, "use_bidirectional_attention", False):
        return "it attends both ways"
    rope = getattr(getattr(base, "rotary_emb", None), "rope_type", None)
    ropes = set(rope.values()) if isinstance(rope, dict) else {rope}
    if ropes - set(_ROPES) or (isinstance(rope, dict) and ropes - _STATIC_ROPE):
        return f"its rope ({', '.join(sorted(map(str, ropes)))}) is not one of {', '.join(_ROPES)}"
    if isinstance(rope, dict) and not {layer.self_attn.layer_type for layer in layers} <= set(rope):
        return "its layer types are not all among its rotary embedding's"
    return None


@dataclass
class _Layer:
    qkv: nn.Linear  # [W_q; W_k; W_v] (and their biases)
    gate_up: nn.Linear  # [W_gate; W_up]
    o: nn.Linear
    down: nn.Linear
    act: nn.Module  # the MLP's activation
    norms: dict[str, tuple[torch.Tensor, float]]  # name -> (weight, eps): input, post_attention, ...
    kind: str  # the rotation it takes: its layer type where rotations differ by type, else "all"
    scaling: float  # of q . k, the attention module's
    window: int | None
    softcap: float | None  # of the attention logits (Gemma 2)
    index: int


@dataclass(frozen=True)
class _Longrope:
    """Phi-3's longrope: the short factors' inverse frequencies while a sequence is at most
    `original` positions long, the long factors' past it. Transformers picks the set by the
    longest sequence in its call; here each row by its own (its largest position in the pass + 1),
    so no row's rotation depends on the rows beside it. As in transformers' incremental decoding,
    keys already cached keep the set they were written with: a row whose pass crosses `original`
    rotates that pass's tokens and all later ones with the long set."""

    short: torch.Tensor  # (head_dim / 2,)
    long: torch.Tensor
    original: int

    @classmethod
    def of(cls, rotary: nn.Module, config) -> _Longrope:
        original = config.rope_parameters["original_max_position_embeddings"]
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](config, rotary.original_inv_freq.device, seq_len=original + 1)
        return cls(rotary.original_inv_freq.float(), long.float(), original)

    def inverse_frequencies(self, reach: torch.Tensor) -> torch.Tensor:
        """(T, head_dim / 2): each token's set, by its row's reach (largest position + 1)."""
        return torch.where((reach > self.original)[:, None], self.long, self.short)


class PagedDecoder:
    """Called as the model's base model in a paged pass (`forward_hidden`): input_ids and
    position_ids (1, T), the pass layout; returns the final hidden states (1, T, d)."""

    def __init__(self, base: nn.Module):
        config = base.config
        family = _LAYERS[type(base.layers[0]).__name__]
        self.gemma = family.gemma
        self.embed = base.embed_tokens  # Gemma's scales by sqrt(d) itself
        self.rotary = base.rotary_emb
        rope = self.rotary.rope_type
        self.by_type = isinstance(rope, dict)  # Gemma 3: one rotation per layer type
        self.longrope = _Longrope.of(self.rotary, config) if rope == "longrope" else None
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = base.layers[0].self_attn.head_dim
        self.final_norm = self._norm(base.norm)
        self.layers = [self._layer(i, layer, family, config) for i, layer in enumerate(base.layers)]

    def _norm(self, module: nn.Module) -> tuple[torch.Tensor, float]:
        """An RMSNorm's weight in fp32, made once (Gemma's 1 + w), and its eps."""
        weight = module.weight.detach().float()
        eps = getattr(module, "eps", None)
        return (1.0 + weight if self.gemma else weight), (module.variance_epsilon if eps is None else eps)

    def _layer(self, index: int, layer: nn.Module, family: _Family, config) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        names = ("input_layernorm", "post_attention_layernorm", *(_SANDWICH if self.gemma else ()))
        norms = {name: self._norm(getattr(layer, name)) for name in names}
        if hasattr(attention, "q_norm"):  # Gemma 3, Qwen 3: q and k normalised per head
            norms["q"], norms["k"] = self._norm(attention.q_norm), self._norm(attention.k_norm)
        # Mistral's and Phi-3's window is their config's, Qwen's and Gemma's each layer's own.
        window = getattr(attention, "sliding_window", getattr(config, "sliding_window", None))
        return _Layer(
            qkv=_fuse(*(getattr(attention, name) for name in family.qkv)),
            gate_up=_fuse(*(getattr(mlp, name) for name in family.gate_up)),
            o=attention.o_proj,
            down=mlp.down_proj,
            act=getattr(mlp, family.act),
            norms=norms,
            kind=attention.layer_type if self.by_type else "all",
            scaling=attention.scaling,
            window=window,
            softcap=getattr(attention, "attn_logit_softcapping", None),
            index=index,
        )

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, specdec_pass, **_) -> BaseModelOutput:
        hidden = self.embed(input_ids[0])  # (T, d)
        kinds = {layer.kind for layer in self.layers}
        rotations = {kind: self._rotation(position_ids, kind, specdec_pass) for kind in kinds}
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for layer in self.layers:
            residual = hidden
            qkv = layer.qkv(_rms(hidden, layer.norms["input_layernorm"]))  # (T, q + 2 kv)
            q = qkv[:, :q_width].view(-1, self.heads, self.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(-1, self.kv_heads, self.head_dim)
            v = qkv[:, q_width + kv_width :].view(-1, self.kv_heads, self.head_dim)
            if "q" in layer.norms:
                q, k = _rms(q, layer.norms["q"]), _rms(k, layer.norms["k"])
            cos, sin = rotations[layer.kind]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            attended = specdec_pass.attend(layer.index, q, k, v, layer.scaling, layer.window, layer.softcap)
            x = layer.o(attended.reshape(attended.shape[0], -1))
            if self.gemma:
                hidden = residual + _rms(x, layer.norms["post_attention_layernorm"])
                x = layer.gate_up(_rms(hidden, layer.norms["pre_feedforward_layernorm"]))
            else:
                hidden = residual + x
                x = layer.gate_up(_rms(hidden, layer.norms["post_attention_layernorm"]))
            gate, up = x.chunk(2, dim=-1)
            x = layer.down(layer.act(gate) * up)
            hidden = hidden + (_rms(x, layer.norms["post_feedforward_layernorm"]) if self.gemma else x)
        return BaseModelOutput(last_hidden_state=_rms(hidden, self.final_norm).unsqueeze(0))

    def _rotation(self, position_ids: torch.Tensor, kind: str, specdec_pass) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each position's angles, (T, 1, rotary_dim / 2), as transformers' rotary
        embedding computes them (in fp32, times the rope type's attention scaling)."""
        dtype = self.embed.weight.dtype
        if self.by_type:
            inv_freq = getattr(self.rotary, f"{kind}_inv_freq").float()
            scaling = getattr(self.rotary, f"{kind}_attention_scaling")
        elif self.longrope is not None:
            inv_freq, scaling = self.longrope.inverse_frequencies(specdec_pass.reach), self.rotary.attention_scaling
        else:  # a rope fixed at load time: the model's own module, cos and sin over the rotary dims, halves equal
            cos, sin = self.rotary(self.embed.weight[:1].unsqueeze(0), position_ids)  # (1, T, rotary_dim)
            half = cos.shape[-1] // 2
            return cos[0, :, :half].to(dtype).unsqueeze(1), sin[0, :, :half].to(dtype).unsqueeze(1)
        angles = position_ids[0, :, None].float() * inv_freq  # (T, rotary_dim / 2)
        return (angles.cos() * scaling).to(dtype).unsqueeze(1), (angles.sin() * scaling).to(dtype).unsqueeze(1)


def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """RMSNorm: normalised and scaled in fp32, then cast back (a no-op in fp32)."""
    weight, eps = norm
    return F.rms_norm(x.float(), weight.shape, weight, eps).type_as(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (T, heads, head_dim) by halves of its first rotary_dim = 2 cos.shape[-1]
    dims: [x1 c - x2 s, x2 c + x1 s], the rest passed through (Phi's partial rotary)."""
    rotary_dim = 2 * cos.shape[-1]
    x1, x2 = x[..., :rotary_dim].chunk(2, dim=-1)
    rotated = (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
    return torch.cat(rotated if rotary_dim == x.shape[-1] else (*rotated, x[..., rotary_dim:]), dim=-1)


def _fuse(*linears: nn.Linear) -> nn.Linear:
    """One linear layer computing `linears` side by side over the same input: its weight (and
    bias, where any has one: zeros for those without) is theirs stacked, and theirs become views
    into it (no copy stays behind)."""
    if len(linears) == 1:  # stored fused already (Phi-3's qkv_proj, gate_up_proj)
        return pack_weights(use_column_kernels(linears[0]))
    first = linears[0].weight
    stacked = torch.cat([linear.weight.detach() for linear in linears])
    with_bias = any(linear.bias is not None for linear in linears)
    fused = nn.Linear(first.shape[1], stacked.shape[0], bias=with_bias, device="meta")
    fused.weight = nn.Parameter(stacked, requires_grad=False)
    if with_bias:
        biases = [
            linear.bias.detach() if linear.bias is not None else first.new_zeros(linear.weight.shape[0])
            for linear in linears
        ]
        fused.bias = nn.Parameter(torch.cat(biases), requires_grad=False)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = stacked[start : start + rows]
        if with_bias and linear.bias is not None:
            linear.bias.data = fused.bias.data[start : start + rows]
        linear.__dict__.pop("_packed", None)  # its packed copy, if any: the fused one serves
        start += rows
    return pack_weights(use_column_kernels(fused))
