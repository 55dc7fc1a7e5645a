"""Generated tokens -> text that is safe to emit, with EOS and stop strings applied.

The whole generated sequence is re-decoded after each round (cheap next to a forward pass), and
text is emitted only up to a point no later token can change: a trailing U+FFFD may be half of
a multi-byte character, and a trailing prefix of a stop string may become that stop string. So
streamed deltas concatenate to the final text and nothing after a stop is ever emitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"


class OutputText:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Iterable[int], stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        self.text = ""  # everything emitted so far
        self.stopped = False  # an EOS token or a stop string ended the output

    def add(self, new_ids: Sequence[int]) -> tuple[list[int], str]:
        """Append the tokens of a round; returns the tokens kept and the text that became safe."""
        kept: list[int] = []
        for token in new_ids:
            kept.append(token)
            if token in self.eos_token_ids:
                self.stopped = True
                break
        start = len(self.token_ids)
        self.token_ids.extend(kept)
        decoded = self._decode(self.token_ids)
        cut = self._find_stop(decoded)
        if cut is not None:
            self.stopped = True
            # Keep only the tokens needed to complete the stop string: nothing after it is emitted.
            while len(self.token_ids) > start + 1 and self._find_stop(self._decode(self.token_ids[:-1])) is not None:
                self.token_ids.pop()
            kept = self.token_ids[start:]
            return kept, self._emit(decoded[:cut])
        if self.stopped:
            return kept, self._emit(decoded)
        return kept, self._emit(decoded[: self._safe_end(decoded)])

    def finish(self) -> str:
        """The held-back tail, when generation ends for a reason other than a stop."""
        return self._emit(self._decode(self.token_ids))

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _find_stop(self, decoded: str) -> int | None:
        """Index where the earliest stop string begins (searching only where one could be new)."""
        longest = max((len(s) for s in self.stop), default=0)
        search_from = max(0, len(self.text) - longest)
        hits = [i for s in self.stop if (i := decoded.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _safe_end(self, decoded: str) -> int:
        end = len(decoded.rstrip(_REPLACEMENT))
        held = 0  # the longest tail that is a proper prefix of some stop string
        for s in self.stop:
            held = max([held] + [n for n in range(1, min(len(s) - 1, end) + 1) if decoded.endswith(s[:n], 0, end)])
        return end - held

    def _emit(self, upto: str) -> str:
        # Earlier emitted text is final; a decoder that rewrote it cannot take it back.
        delta = upto[len(self.text) :] if upto.startswith(self.text) else ""
        self.text += delta
        return delta
