"""The target's log-probabilities of committed tokens as the public API's LogprobEntry items.

The target reports, per request and step, each committed token's log-probability and the most
likely tokens at its position (target_service/logprobs.py); the router keeps the entries of
the tokens its stop rules kept and spells every token out (its text alone and its bytes), so
that clients need no tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from protos import generation_pb2 as pb
from protos import target_pb2
from router.tokenizer import Tokenizer

log = logging.getLogger("splitspec.router")


class LogprobSpeller:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._spelled: dict[int, tuple[str, bytes]] = {}  # at most the vocabulary

    def entries(
        self, answer: target_pb2.Logprobs, token_ids: Sequence[int]
    ) -> list[pb.LogprobEntry]:
        """One entry per kept token (a prefix of what the target answered for); none where
        the target sent too few (one that predates logprobs): a warning, not a failed step."""
        if len(answer.token_logprobs) < len(token_ids):
            log.warning(
                "the target sent %d logprobs for %d committed tokens: the block goes without",
                len(answer.token_logprobs), len(token_ids),
            )  # fmt: skip
            return []
        top = len(answer.top_ids) // max(1, len(answer.token_logprobs))
        return [
            pb.LogprobEntry(
                chosen=self._token(token, answer.token_logprobs[j]),
                top=[
                    self._token(answer.top_ids[k], answer.top_logprobs[k])
                    for k in range(j * top, (j + 1) * top)
                ],
            )
            for j, token in enumerate(token_ids)
        ]

    def _token(self, token_id: int, logprob: float) -> pb.TokenLogprob:
        spelled = self._spelled.get(token_id)
        if spelled is None:
            text = self.tokenizer.decode([token_id])
            spelled = self._spelled[token_id] = (text, self.tokenizer.token_bytes(token_id))
        return pb.TokenLogprob(
            token_id=token_id, logprob=logprob, token=spelled[0], token_bytes=spelled[1]
        )
