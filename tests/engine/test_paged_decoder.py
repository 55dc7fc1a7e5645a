"""The paged decoder: it serves the families it knows (Gemma 2 and 3, Llama with and without
Llama 3's rope scaling, Mistral, Qwen 2 and 3, Phi-3 with longrope) and no other, its fused
projections are views of one storage (the model's parameters and plain forwards unchanged), and a
pass through it gives the logits transformers' modules give, prefill chunks past the windows,
verify rows and trees alike."""

from __future__ import annotations

import pytest
import torch
from tiny import PHI3_ORIGINAL_POSITIONS, llama_config, make_tiny_model, save_random
from transformers import LlamaForCausalLM

from specdec.core import tree
from specdec.runtime import paged_decoder as decoders
from specdec.runtime.kv_pool import BlockTable, KVBlockPool, KVShape
from specdec.runtime.loading import load_model
from specdec.runtime.paged_decoder import PagedDecoder, paged_decoder
from specdec.runtime.ragged import Row, ragged_forward, use_paged_attention

MiB = 1 << 20


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


FUSED = ("gemma2", "gemma3", "llama", "llama3", "mistral", "qwen2", "qwen3", "phi3")


def _private(kind: str, tmp_path):
    """A private tiny model (the decoder fuses its weights in place), 3 layers, window 8."""
    return load_model(str(make_tiny_model(kind, tmp_path / kind, seed=4, num_layers=3, sliding_window=8)))


@pytest.mark.parametrize("kind", FUSED)
def test_it_serves_the_families_it_knows(tmp_path, kind):
    model = _private(kind, tmp_path).model
    assert isinstance(paged_decoder(model), PagedDecoder)
    assert paged_decoder(model) is paged_decoder(model)  # made once


def test_other_families_keep_transformers_modules(tiny):
    assert paged_decoder(tiny("gpt2", 1).model) is None


@pytest.mark.parametrize("kind", ["gemma3", "qwen2", "phi3"])
@torch.inference_mode()
def test_fused_projections_are_views_and_leave_the_model_unchanged(tmp_path, kind):
    model = _private(kind, tmp_path).model
    before = {name: t.clone() for name, t in model.state_dict().items()}
    ids = torch.tensor([_ids(0, 20)])
    plain = model(input_ids=ids, use_cache=False).logits
    decoder = paged_decoder(model)
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    fused = decoder.layers[1]
    if kind == "phi3":  # stored fused: the decoder runs the modules themselves
        assert fused.qkv is attention.qkv_proj and fused.gate_up is mlp.gate_up_proj
    else:
        assert attention.q_proj.weight.data_ptr() == fused.qkv.weight.data_ptr()
        k_storage = attention.k_proj.weight.untyped_storage().data_ptr()
        assert k_storage == fused.qkv.weight.untyped_storage().data_ptr()
        assert mlp.up_proj.weight.untyped_storage().data_ptr() == fused.gate_up.weight.untyped_storage().data_ptr()
    if kind == "qwen2":  # q, k and v biases: one stacked bias, theirs views of it
        assert attention.v_proj.bias.untyped_storage().data_ptr() == fused.qkv.bias.untyped_storage().data_ptr()
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], t) for name, t in before.items())
    assert torch.equal(model(input_ids=ids, use_cache=False).logits, plain)


@pytest.mark.parametrize("kind", FUSED)
@torch.inference_mode()
def test_a_pass_gives_the_modules_logits(tmp_path, kind):
    """The same rows through the paged decoder and through transformers' modules, each on its own
    pool: prefills past the window, then verify rows beside a tree, then decode rows."""
    model = _private(kind, tmp_path).model
    use_paged_attention(model)
    decoder = paged_decoder(model)
    tokens, parents = tree.from_branches([[5, 6, 7], [5, 9], [11, 12]])
    steps = [
        [(_ids(1, 23), 2, None), (_ids(2, 5), 1, None), (_ids(3, 1), 1, None)],
        [([7, 8, 9], 3, None), ([10, *tokens], len(tokens) + 1, parents), ([4], 1, None)],
    ]
    outputs = {}
    for arm in ("paged", "modules"):
        model.__dict__[decoders._ATTR] = decoder if arm == "paged" else None
        pool = KVBlockPool(KVShape.of(model.config), 4 * MiB, block_size=4)
        tables = [BlockTable() for _ in range(3)]
        got = []
        for step in steps:
            rows = []
            for table, (new, keep, tree_parents) in zip(tables, step):
                pool.grow(table, table.length + len(new))
                rows.append(Row(table, new, keep, tree_parents))
            got.append(ragged_forward(model, pool, rows))
        outputs[arm] = got
    model.__dict__[decoders._ATTR] = decoder
    for paged, modules in zip(outputs["paged"], outputs["modules"]):
        torch.testing.assert_close(paged, modules, rtol=1e-5, atol=1e-5)
    # And against a plain forward of the model (no pass, no pool): the first row's prefill.
    plain = model(input_ids=torch.tensor([steps[0][0][0]]), use_cache=False).logits[0, -2:]
    torch.testing.assert_close(outputs["paged"][0][:2], plain, rtol=1e-5, atol=1e-5)


def _run(model, steps, decoder):
    """Each step's logits from `ragged_forward`, one row per table, through `decoder` (None: the
    modules), on a pool of its own."""
    model.__dict__[decoders._ATTR] = decoder
    pool = KVBlockPool(KVShape.of(model.config), 4 * MiB, block_size=4)
    tables = [BlockTable() for _ in steps[0]]
    got = []
    for step in steps:
        rows = []
        for table, new in zip(tables, step):
            pool.grow(table, table.length + len(new))
            rows.append(Row(table, new, len(new)))
        got.append(ragged_forward(model, pool, rows))
    return got


@torch.inference_mode()
def test_longrope_past_the_original_length_gives_the_modules_logits(tmp_path):
    """A row longer than Phi-3's original length rotates with the long factors, as transformers'
    module does for a sequence that long (one row a pass, so its choice and the module's agree)."""
    model = _private("phi3", tmp_path).model
    use_paged_attention(model)
    decoder = paged_decoder(model)
    steps = [[_ids(1, PHI3_ORIGINAL_POSITIONS + 12)], [[7, 8, 9]], [[4]]]
    for paged, modules in zip(_run(model, steps, decoder), _run(model, steps, None)):
        torch.testing.assert_close(paged, modules, rtol=1e-5, atol=1e-5)
    model.__dict__[decoders._ATTR] = decoder


@torch.inference_mode()
def test_longrope_chooses_its_factors_per_row(tmp_path):
    """A short row's logits are the same whether or not a row past the original length shares its
    pass (transformers' module would rotate both with the long factors)."""
    model = _private("phi3", tmp_path).model
    use_paged_attention(model)
    decoder = paged_decoder(model)
    short, long = _ids(2, 20), _ids(3, PHI3_ORIGINAL_POSITIONS + 4)
    alone = _run(model, [[short], [[5, 6]]], decoder)
    beside = _run(model, [[short, long], [[5, 6], [7]]], decoder)
    for one, shared in zip(alone, beside):
        torch.testing.assert_close(shared[: len(one)], one, rtol=1e-5, atol=1e-5)
    mixed = _run(model, [[short, long]], None)[0][: len(short)]
    assert not torch.allclose(mixed, alone[0][: len(short)], rtol=1e-3, atol=1e-3)


def test_a_model_it_does_not_serve_is_named_with_the_reason_once(tmp_path, caplog):
    config = llama_config(259, 1)
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    model = load_model(str(save_random(config, LlamaForCausalLM, tmp_path / "dynamic", seed=0))).model
    with caplog.at_level("WARNING", logger=decoders.__name__):
        assert paged_decoder(model) is None and paged_decoder(model) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == decoders.__name__]
    assert warnings == [
        "llama runs on transformers' modules (exact, slower): its rope (dynamic) is not one of"
        " default, linear, llama3, longrope"
    ]
