"""A request id opened again while the target still holds it starts afresh (the real default
model, in-process).

The state is held when an earlier request under that id ended without its release reaching
the target (a step failed while the target stalled, and the client retried under the same id).
Before, the new request's first item was taken for the old one's continuation: it kept the old
sampling, and its positions mapped to the old request's slots, which the router had given to
other requests since. An item that carries sampling opens a request, whatever is held.
"""

from __future__ import annotations

from target_service.engine import StepItem
from target_service.request_table import SamplingSpec
from tests.test_logit_bias_engine import PLAIN, greedy
from tests.test_logprobs_engine import make_engine, model, prompt  # noqa: F401

HOT = SamplingSpec(temperature=1.5, top_p=1.0, top_k=0, seed=7)
OLD_SLOTS_FROM = 400  # the lost request's slots, the router's to give to others now


def test_an_id_opened_again_starts_afresh(model, prompt) -> None:  # noqa: F811
    fresh = greedy(make_engine(model), prompt, PLAIN, 6)
    engine = make_engine(model)
    lost = [5, 6, 7, 8, 9, 10]
    slots = list(range(OLD_SLOTS_FROM, OLD_SLOTS_FROM + len(lost) + 1))
    engine.forward([StepItem("r", lost, 0, slots, True, HOT)])  # never released

    again = greedy(engine, prompt, PLAIN, 6)  # "r" again, greedy, on slots 0..

    state = engine.table.get("r")
    assert engine.table.slots[state.row, 0].item() == 0, "position 0 in the lost one's slot"
    assert state.sampling == PLAIN
    assert again == fresh
    assert len(engine.table) == 1, "the lost request's row is still held"


def test_an_item_without_sampling_continues_what_is_held(model, prompt) -> None:  # noqa: F811
    engine = make_engine(model)
    n = len(prompt)
    engine.forward([StepItem("r", prompt, 0, list(range(n + 1)), True, PLAIN)])
    row = engine.table.get("r").row
    engine.forward([StepItem("r", [7], n)])
    assert engine.table.get("r").row == row and engine.table.get("r").table_len == n + 1
