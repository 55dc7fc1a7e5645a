"""A model specdec cannot serve at all (an encoder, an encoder-decoder, a vision tower without its
text model) is refused with its name and the reason, before anything serves: by the loader, by
`specdec generate --in-process`, by `specdec up` and by `specdec target`, each exiting 2 without
a traceback."""

from __future__ import annotations

import pytest
from tiny import make_tiny_model
from transformers import (
    BertConfig,
    BertForMaskedLM,
    SiglipVisionConfig,
    SiglipVisionModel,
    T5Config,
    T5ForConditionalGeneration,
)

from specdec.cli.app import main
from specdec.runtime.loading import load_model, prepare
from specdec.runtime.models import UnservableModel
from specdec.target_service.__main__ import main as target_main

SMALL = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64)
UNSERVABLE = {
    "bert": (lambda: BertForMaskedLM(BertConfig(vocab_size=64, num_hidden_layers=1, **SMALL)), "is an encoder"),
    "t5": (
        lambda: T5ForConditionalGeneration(
            T5Config(vocab_size=64, d_model=32, d_ff=64, d_kv=8, num_heads=2, num_layers=1)
        ),
        "is an encoder-decoder",
    ),
    "siglip": (
        lambda: SiglipVisionModel(SiglipVisionConfig(num_hidden_layers=1, image_size=32, patch_size=8, **SMALL)),
        "has no causal language model",
    ),
}


@pytest.fixture(scope="module", params=sorted(UNSERVABLE))
def unservable(request, tmp_path_factory):
    build, reason = UNSERVABLE[request.param]
    path = tmp_path_factory.mktemp(request.param)
    build().save_pretrained(path)
    return str(path), reason


def test_the_loader_refuses_it_naming_model_and_reason(unservable):
    path, reason = unservable
    for load in (load_model, prepare):
        with pytest.raises(UnservableModel, match=reason) as refused:
            load(path)
        assert path in str(refused.value) and "specdec serves decoder-only text models" in str(refused.value)


def test_every_command_refuses_it_before_serving(unservable, capsys, monkeypatch):
    from specdec.telemetry import tracing

    # The tracer provider is the process's to set, once: a test must not take it from later tests.
    monkeypatch.setattr(tracing, "configure_tracing", lambda *args, **kwargs: None)
    path, reason = unservable
    commands = [
        ["generate", "--in-process", "--no-speculation", "--target-model", path, "hi"],
        ["up", "--target-model", path, "--port", "0"],
    ]
    for argv in commands:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"specdec {argv[0]}: model {path!r}" in err and reason in err and "Traceback" not in err
    assert target_main(["--target-model", path]) == 2  # before Ray: no cluster is touched
    err = capsys.readouterr().err
    assert err.startswith(f"specdec target: model {path!r}") and reason in err


def test_a_decoder_only_model_passes(tmp_path):
    prepare(str(make_tiny_model("llama", tmp_path / "llama")))  # raises if refused
