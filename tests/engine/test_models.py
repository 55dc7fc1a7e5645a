"""load_model on tiny random models of three families, GGUF dispatch and caching, and the embedded
Gemma 3 270M (slow the first time: about a minute and a half to convert on 2 CPU cores)."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach a hub

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import EOS_ID, KINDS, TOKENIZER_SIZE, make_tiny_model, make_tiny_pair  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from specdec.drafts import loading as draft_loading  # noqa: E402
from specdec.local.in_process import load_pair  # noqa: E402
from specdec.runtime import models  # noqa: E402
from specdec.runtime.loading import ModelFormat, load_model  # noqa: E402
from specdec.runtime.models import EMBEDDED_NAME  # noqa: E402

TEXT = "héllo wörld ✓"


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {kind: make_tiny_model(kind, root / kind) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_model_loads(tiny_paths, kind):
    loaded = load_model(str(tiny_paths[kind]))
    assert loaded.name == str(tiny_paths[kind])
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert EOS_ID in loaded.eos_token_ids
    assert loaded.max_context == 256
    ids = loaded.tokenizer(TEXT)["input_ids"]
    assert loaded.tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([ids])).logits  # (1, len, vocab)
    assert loaded.vocab_size == logits.shape[-1] == TOKENIZER_SIZE


def test_vocab_size_is_logits_width_not_tokenizer_length(tmp_path):
    loaded = load_model(str(make_tiny_model("llama", tmp_path / "padded", vocab_size=320)))
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([[1, 2, 3]])).logits
    assert len(loaded.tokenizer) == TOKENIZER_SIZE
    assert loaded.vocab_size == logits.shape[-1] == 320


@pytest.mark.parametrize("kind", KINDS)
def test_forward_with_dynamic_cache_matches_full_forward(tiny_paths, kind):
    model = load_model(str(tiny_paths[kind])).model
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))  # 24 > window 8
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        full = model(tokens).logits
        first = model(input_ids=tokens[:, :15], cache=cache, use_cache=True).logits
        second = model(input_ids=tokens[:, 15:], cache=cache, use_cache=True).logits
    assert cache.get_seq_length() == 24
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.cat([first, second], dim=1).argmax(-1), full.argmax(-1))


def test_tiny_gemma3_mixes_sliding_and_full_attention(tiny_paths):
    config = load_model(str(tiny_paths["gemma3"])).model.config
    assert config.sliding_window == 8
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}


def test_tiny_models_are_peaky_and_seeded(tmp_path):
    """Logits spread by several units, so fp32 noise never flips a greedy argmax."""
    target_dir, draft_dir = make_tiny_pair("llama", tmp_path)
    again = load_model(str(make_tiny_model("llama", tmp_path / "again", seed=0))).model
    target, draft = load_model(str(target_dir)), load_model(str(draft_dir))
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = target.model(tokens).logits
        top2 = logits.topk(2, dim=-1).values  # (2, 32, 2)
        assert logits.std() > 2
        assert (top2[..., 0] - top2[..., 1]).min() > 1e-4
        assert torch.equal(again(tokens).logits, logits)
        assert not torch.equal(draft.model(tokens).logits, logits)
    assert target.tokenizer(TEXT)["input_ids"] == draft.tokenizer(TEXT)["input_ids"]


@pytest.mark.parametrize(
    "spec",
    ["/no/such/model/dir", "not a model name", "owner/name/extra", "../up", "missing-file.gguf"],
)
def test_bad_spec_is_a_value_error(spec):
    with pytest.raises(ValueError, match="spec"):
        load_model(spec)


def test_existing_file_that_is_not_gguf_is_a_value_error(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        load_model(str(tmp_path / "weights.bin"))


def test_a_target_load_never_asks_the_draft_formats(tiny_paths, monkeypatch):
    """`load_pair` loads its target through the runtime loader alone: draft formats that refuse
    every spec stop only the draft's load."""

    def refuse(spec):
        raise AssertionError(f"asked whether {spec} is a draft")

    monkeypatch.setattr(draft_loading, "FORMATS", (ModelFormat(refuse, refuse, refuse),))
    spec = str(tiny_paths["llama"])
    target, draft = load_pair(spec, None)
    assert target.name == spec and draft is None
    with pytest.raises(AssertionError, match="is a draft"):
        load_pair(spec, spec)


def test_a_target_loads_without_importing_drafts(tiny_paths):
    """The target tier and the runtime loader never import the drafts package."""
    code = (
        "import sys\n"
        "import specdec.target_service.actor\n"
        "from specdec.runtime.loading import load_model\n"
        "load_model(sys.argv[1])\n"
        "print(sorted(m for m in sys.modules if m.startswith('specdec.drafts')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tiny_paths["llama"])], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf path whose 'conversion' writes a tiny llama, counting the conversions."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "some-model.gguf"
    gguf.write_bytes(b"GGUF")
    calls: list[Path] = []

    def convert(path: Path, out: Path) -> None:
        calls.append(path)
        make_tiny_model("llama", out)

    monkeypatch.setattr(models, "_convert_gguf", convert)
    return gguf, calls


def test_gguf_path_is_converted_once_and_cached(fake_gguf, tmp_path):
    gguf, calls = fake_gguf
    first = load_model(str(gguf))
    second = load_model(str(gguf))
    assert calls == [gguf.resolve()]
    assert first.name == second.name == str(gguf)
    assert first.vocab_size == TOKENIZER_SIZE
    cached = list((tmp_path / "cache" / "models").iterdir())
    assert [p.name.startswith("some-model-") for p in cached] == [True]


def test_interrupted_conversion_leaves_no_cache(fake_gguf, tmp_path, monkeypatch):
    gguf, _ = fake_gguf

    def half_convert(path: Path, out: Path) -> None:
        make_tiny_model("llama", out)
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_convert_gguf", half_convert)
    with pytest.raises(KeyboardInterrupt):
        load_model(str(gguf))
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@pytest.mark.slow
def test_embedded_default_generates():
    """Uses the real cache ($SPECDEC_CACHE_DIR or ~/.cache/specdec) so only the first run converts."""
    loaded = load_model()
    assert loaded.name == EMBEDDED_NAME
    assert loaded.vocab_size == 262144
    assert {1, 106} <= loaded.eos_token_ids  # <eos>, <end_of_turn>
    config = loaded.model.config
    assert config.sliding_window == 512 and "sliding_attention" in config.layer_types
    assert loaded.max_context == 32768

    enc = loaded.tokenizer("The capital of France is", return_tensors="pt")
    assert enc.input_ids[0, 0].item() == 2  # Gemma prepends <bos>
    with torch.inference_mode():
        out = loaded.model.generate(**enc, do_sample=False, max_new_tokens=5)  # (1, prompt + 5)
        logits = loaded.model(**enc, cache=DynamicCache(config=config), use_cache=True).logits
    text = loaded.tokenizer.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert out.shape[1] == enc.input_ids.shape[1] + 5
    assert text.strip()
    assert logits.shape[-1] == loaded.vocab_size
