"""The target's log-probabilities of committed tokens as the public API's LogprobEntry items.

The target reports, per request and step, each committed token's log-probability and the most
likely tokens at its position (target_service/logprobs.py); the router keeps the entries of
the tokens its stop rules kept and spells every token out (its text alone and its bytes), so
that clients need no tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from protos import generation_pb2 as pb
from protos import target_pb2
from router.tokenizer import Tokenizer

log = logging.getLogger("splitspec.router")


class LogprobSpeller:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._spelled: dict[int, tuple[str, bytes]] = {}  # at most the vocabulary

    def fill(self, dest: Any, answer: target_pb2.Logprobs, token_ids: Sequence[int]) -> None:
        """One entry per kept token (a prefix of what the target answered for), added in place
        to ``dest`` (a repeated LogprobEntry field: no message is built twice); none where the
        target sent too few (one that predates logprobs): a warning, not a failed step."""
        logprobs, top_ids, top_logprobs = answer.token_logprobs, answer.top_ids, answer.top_logprobs
        if len(logprobs) < len(token_ids):
            log.warning(
                "the target sent %d logprobs for %d committed tokens: the block goes without",
                len(logprobs), len(token_ids),
            )  # fmt: skip
            return
        top = len(top_ids) // max(1, len(logprobs))
        for j, token in enumerate(token_ids):
            entry = dest.add()
            text, raw = self._spelled_as(token)
            chosen = entry.chosen
            chosen.token_id, chosen.logprob, chosen.token, chosen.token_bytes = (
                token, logprobs[j], text, raw
            )
            add = entry.top.add
            for k in range(j * top, (j + 1) * top):
                text, raw = self._spelled_as(top_ids[k])
                add(token_id=top_ids[k], logprob=top_logprobs[k], token=text, token_bytes=raw)

    def entries(
        self, answer: target_pb2.Logprobs, token_ids: Sequence[int]
    ) -> list[pb.LogprobEntry]:
        """``fill``'s entries as a list."""
        holder = pb.GenerateResponse()
        self.fill(holder.logprobs, answer, token_ids)
        return list(holder.logprobs)

    def _spelled_as(self, token_id: int) -> tuple[str, bytes]:
        """A token's text alone and its exact bytes."""
        spelled = self._spelled.get(token_id)
        if spelled is None:
            text = self.tokenizer.decode([token_id])
            spelled = self._spelled[token_id] = (text, self.tokenizer.token_bytes(token_id))
        return spelled
