"""Decoding ahead of the coordinator, for sessions that decode without drafts.

A round without drafts is target-only decoding: its next round, if it too has no drafts, feeds
exactly the token this one returned, and its answer is fixed by the model and the keyed
randomness (`specdec.core.rng`), whoever computes it. So while the coordinator turns round r's
token into round r+1 (transport, commit, streaming: the model would sit idle), the actor already
runs round r+1 as a round of its own. When the coordinator's round r+1 arrives and is that round
(same held prefix, same new token, no drafts, same sampling), it takes the result, or waits for
the pass computing it; any other round drops the look-ahead. Only one round is run ahead of the
coordinator, and only for a session whose last two rounds had no drafts (speculation off, or
drafts the load prices out): a round with drafts that found a look-ahead in its way would wait a
whole pass for it.

The result is the one target-only decoding gives: the look-ahead is an ordinary round of the
engine, over the context the coordinator then confirms.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.core.sampling import SamplingParams
from specdec.target_service.protocol import VerifyRequest


@dataclass
class Ahead:
    """A round run ahead for a session: the round the coordinator is expected to send next."""

    held: int  # tokens the last reply said the actor holds: the round's committed_len
    tokens: list[int]  # the whole sequence the round decides after (the last reply's token included)
    sampling: SamplingParams
    round: object  # the actor's queued round computing it (its future gives the reply)

    def serves(self, request: VerifyRequest) -> bool:
        """`request` is the round this look-ahead computes."""
        return (
            not request.draft_ids
            and request.draft_parents is None
            and request.sampling == self.sampling
            and request.committed_len == self.held
            and list(request.new_tokens) == self.tokens[self.held :]
        )


def plain(request: VerifyRequest) -> bool:
    """A round with no drafts."""
    return not request.draft_ids
