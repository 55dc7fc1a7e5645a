"""Prompt-lookup drafting (Saxena 2023, "Prompt Lookup Decoding"): no model at all.

When the answer copies the prompt (code edits, summaries with quotes, RAG), the tokens that
followed an earlier occurrence of the context's last n tokens are a good guess for what comes
next. Proposals are point masses (no q): the acceptance rule treats them exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


@dataclass(frozen=True)
class NgramConfig:
    max_ngram: int = 3  # longest suffix tried first: longer matches predict better
    min_ngram: int = 1  # shortest suffix worth matching


class NgramDrafter:
    def __init__(self, config: NgramConfig = NgramConfig()):
        self.config = config

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier match of the longest suffix."""
        if k <= 0 or len(tokens) < 2:
            return []
        context = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.config.max_ngram, len(context) - 1), self.config.min_ngram - 1, -1):
            suffix = context[-n:]
            # Candidate starts i with i + n < len: the match must be followed by at least one token,
            # which also excludes the suffix matching itself.
            windows = sliding_window_view(context[:-1], n)  # (len - n, n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return context[start : start + k].tolist()
        return []
