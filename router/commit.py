"""Commit, the last phase of a step: what the target answered becomes the requests' streams.

Each request's block goes through its OutputStream (stop rules: EOS, stop ids and strings, the
length limit, counted by ids), advances what the request has computed and is streamed; a block
that ends its request carries the final item (usage, timings, speculation totals) and counts in
the server's counters. Runs on the scheduler's task, like every other mutation of request state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from protos import draft_pb2, target_pb2
from protos import generation_pb2 as pb
from router import telemetry
from router.final_item import fill_final
from router.grammar_bursts import GrammarBursts
from router.logprobs import LogprobSpeller
from router.output import Committed, OutputStream
from router.prompt_scores import attach_scores, record_scores
from router.request import Request
from router.stats import ServerCounters
from router.tokenizer import Tokenizer

if TYPE_CHECKING:
    from router.scheduler import Planned


class Commit:
    def __init__(
        self, tokenizer: Tokenizer, counters: ServerCounters, bursts: GrammarBursts
    ) -> None:
        self.tokenizer = tokenizer
        self.counters = counters
        self.bursts = bursts
        self.outputs: dict[str, OutputStream] = {}  # by request id, from submit to finish
        self.speller = LogprobSpeller(tokenizer)

    def open(self, req: Request) -> None:
        self.outputs[req.request_id] = OutputStream(self.tokenizer, req.options)

    def close(self, req: Request) -> None:
        self.outputs.pop(req.request_id, None)

    def plain(
        self, plan: list[Planned], reply: target_pb2.ForwardResponse | None, steps: int
    ) -> list[Request]:
        """The Forward's sampled ids; returns the requests they ended. ``steps`` > 1: K ids
        per request, kept up to the first stop (router/multi_step.py) or, under structured
        output, the first token the format refuses (router/grammar_bursts.py). The reply's
        logprobs (one per sampled item) and prompt scores (one per item) are empty where none
        asked."""
        if reply is None:
            return []
        sampled = iter(reply.next_token_ids)
        answers = iter(reply.logprobs)
        scores = iter(reply.scored)
        done: list[Request] = []
        for p in plan:
            score = next(scores, None)
            if score is not None:
                record_scores(self.speller, p.req, p.req.num_computed, score)
            if not p.sample:
                p.req.num_computed += p.num_tokens
                continue
            # A target-only step leaves the drafter behind: it catches up afterwards.
            p.req.draft_synced = False
            block = self._allowed(p.req, [next(sampled) for _ in range(steps)])
            # K steps computed K positions; finishing caches only those of kept tokens. A cut
            # burst's last kept token runs again, masked: its position counts as not computed.
            p.req.num_computed += p.num_tokens - 1 + len(block)
            answer = next(answers, None)
            if not block:  # a burst whose first token the format refused: nothing to stream
                continue
            committed = self._commit(p.req, block)
            if self._emit(p.req, committed, answer):
                done.append(p.req)
        return done

    def _allowed(self, req: Request, block: list[int]) -> list[int]:
        """A constrained request's block up to the first token its format refuses (only a
        burst's can be: a single step's draw was masked)."""
        if req.constraint is None:
            return block
        if len(block) == 1:
            self.bursts.masked_step(req)
            return block
        return self.bursts.keep(req, block)

    def verified(
        self,
        verify: list[tuple[Request, draft_pb2.DraftTree]],
        items: list[target_pb2.VerifyItem],
        results: list[target_pb2.VerifyResult],
    ) -> list[Request]:
        """The blocks verified; returns the requests they ended (each request's drafter update
        is already made: DraftAhead's after_verify)."""
        done: list[Request] = []
        for (req, _), item, result in zip(verify, items, results, strict=True):
            telemetry.observer().tree_verified(len(item.token_ids) - 1, result.num_accepted)
            req.num_computed += 1 + result.num_accepted  # the root and the accepted drafts
            committed = self._commit(req, list(result.token_ids))
            if self._emit(req, committed, result.logprobs):
                done.append(req)
        return done

    def _commit(self, req: Request, block: list[int]) -> Committed:
        """The block through the request's stop rules; a format's grammar follows what they
        kept, and where the format allows nothing next but one EOS, that EOS is committed too:
        the target's masked draw there could be nothing else, so its step is saved (not where
        the request asked for logprobs, which that step reports, or min_tokens still binds)."""
        out = self.outputs[req.request_id]
        committed = out.commit(block)
        if req.constraint is None:
            return committed
        req.constraint.advance(committed.token_ids)
        eos = req.constraint.only_eos_next()
        if committed.finish_reason or eos is None or req.options.logprobs or req.min_tokens_binds:
            return committed
        end = out.commit([eos])
        req.constraint.advance(end.token_ids)
        return Committed(
            committed.token_ids + end.token_ids, committed.text + end.text,
            end.finish_reason, end.matched_stop,
        )  # fmt: skip

    def aborted(self, req: Request) -> None:
        """The final item of a request its client aborted: no tokens, its usage and timings."""
        item = pb.GenerateResponse(request_id=req.request_id)
        self._fill_final(item, req, pb.FINISH_REASON_ABORT, "")
        req.outbox.put_nowait(item)

    def _emit(
        self, req: Request, committed: Committed, logprobs: target_pb2.Logprobs | None
    ) -> bool:
        """Streams a committed block (with its tokens' log-probabilities where the request
        asked for them); returns True when it ends the request."""
        now = time.perf_counter()
        item = pb.GenerateResponse(
            request_id=req.request_id, token_ids=committed.token_ids, text=committed.text
        )
        if req.first_token is None and req.options.prompt_logprobs:
            attach_scores(item, req)
        req.first_token = req.first_token or now
        req.output_ids += committed.token_ids
        telemetry.observer().tokens_committed(req, len(committed.token_ids), now)
        if req.options.logprobs and logprobs is not None:
            self.speller.fill(item.logprobs, logprobs, committed.token_ids)
        if committed.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            self._fill_final(item, req, committed.finish_reason, committed.matched_stop)
        req.outbox.put_nowait(item)
        return committed.finish_reason != pb.FINISH_REASON_UNSPECIFIED

    def _fill_final(
        self, item: pb.GenerateResponse, req: Request, reason: pb.FinishReason, matched: str
    ) -> None:
        now = time.perf_counter()
        fill_final(item, req, reason, matched, now)
        self.counters.record_finish(
            len(req.output_ids), req.verify_steps, req.draft_tokens, req.accepted_tokens
        )
        telemetry.observer().request_finished(req, reason, now)
