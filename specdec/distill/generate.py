"""Training rows the target writes itself: greedy continuations of corpus openings.

A served draft never predicts human text: it predicts the target's own output, conditioned on
a prompt. Greedy output of a small model has its own statistics (it loops, repeats phrases and
code lines, and prefers its favourite continuations), which a draft distilled on human text
alone never sees (a draft trained on stdlib source and man pages agrees with the target on 23%
of the free-continuation benchmark's generated tokens, 20% of held-out human text).
Rows of "corpus opening + the target's greedy continuation" put the serving distribution into
training (self-distillation, as in Medusa-2's and EAGLE's data regeneration).

Every row of a batch starts with the same number of prompt tokens (the first tokens of a corpus
row, BOS included), so generation needs no padding; the file of rows is saved after each batch,
so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specdec.runtime.models import LoadedModel


@torch.no_grad()
def generated_rows(
    target: LoadedModel,
    prompts: torch.Tensor,
    seq_len: int,
    path: Path,
    batch: int = 32,
    progress: bool = True,
) -> torch.Tensor:
    """(n, seq_len) rows: each prompt (n, p) continued greedily by the target to seq_len tokens.

    Rows already in `path` are kept (a resumed run continues after them); the file is rewritten
    after every batch.
    """
    n, prompt_len = prompts.shape
    if not 0 < prompt_len < seq_len:
        raise ValueError(f"prompt length {prompt_len} must lie in (0, seq_len={seq_len})")
    done = torch.load(path) if path.is_file() else torch.empty(0, seq_len, dtype=torch.long)
    if done.shape[1] != seq_len:
        raise ValueError(f"{path} holds rows of {done.shape[1]} tokens, not {seq_len}: delete it to start over")
    if len(done) >= n:
        return done[:n]
    from tqdm import tqdm

    bar = tqdm(
        total=n, initial=len(done), desc="target continuations", unit="row", disable=not progress, dynamic_ncols=True
    )
    new_tokens = seq_len - prompt_len
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    while len(done) < n:
        chunk = prompts[len(done) : len(done) + batch]
        # min_new_tokens: every row is seq_len long (an early EOS would need padding and masks;
        # a base model rarely ends mid-document, and the tokens after a suppressed EOS are still
        # the target's greedy choice given the row).
        out = target.model.generate(
            chunk,
            attention_mask=torch.ones_like(chunk),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )  # (b, seq_len)
        done = torch.cat([done, out[:, :seq_len].cpu()])
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(done, tmp)
        tmp.replace(path)
        bar.update(len(chunk))
    bar.close()
    print(
        f"target continuations: {len(done)} rows of {prompt_len} prompt + {new_tokens} generated tokens",
        file=sys.stderr,
    )
    return done
