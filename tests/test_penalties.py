"""Presence/frequency penalties on the target: a verified tree node's logits are penalised
with exactly the counts sequential decoding would have there (committed completion + the
drafts on the node's path), and counts follow what was sampled."""

from __future__ import annotations

import torch

from target_service.penalties import penalize, penalize_tree, record
from target_service.request_table import RequestState, SamplingSpec
from target_service.tree import tree_attention_mask

VOCAB = 12


def state(presence: float, frequency: float, committed: list[int]) -> RequestState:
    s = RequestState(0, 0, SamplingSpec(0.0, 1.0, 0, 0, presence, frequency))
    record([s], [committed], VOCAB, torch.device("cpu"))
    return s


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_tree_nodes_get_the_counts_of_their_path() -> None:
    torch.manual_seed(0)
    parents = [[-1, 0, 0, 1, 1, 3, 2], [-1, 0, 1, 2, 0, 0, 0]]
    tokens = torch.tensor([[4, 5, 5, 7, 4, 5, 9], [1, 1, 1, 1, 2, 3, -1]])
    valid = torch.tensor([[True] * 7, [True] * 6 + [False]])
    parent_t = torch.tensor([[p if p >= 0 else -1 for p in row] for row in parents])
    parent_t[1, 6] = 0  # padding
    layout = tree_attention_mask(parent_t, valid)
    states = [state(0.7, 0.4, [5, 5, 3]), state(0.0, 1.3, [1])]
    logits = torch.randn(2, 7, VOCAB)
    got = penalize_tree(logits, states, tokens, valid, layout.ancestors)
    for b, st in enumerate(states):
        for i in range(7):
            if not valid[b, i]:
                continue
            # Sequentially: the committed completion, then the drafts from the root down to i.
            seq = st.counts.clone()
            for j in path_to(parents[b], i):
                seq[tokens[b, j]] += 1
            want = penalize(logits[b, i][None], [RequestState(0, 0, st.sampling, seq)])[0]
            torch.testing.assert_close(got[b, i], want, rtol=0, atol=0)


def test_openai_formula_and_no_penalty_is_untouched() -> None:
    logits = torch.zeros(2, VOCAB)
    s = state(0.5, 0.25, [3, 3, 3, 7])
    out = penalize(logits, [s, state(0.0, 0.0, [3])])
    assert out[0, 3] == -(0.25 * 3 + 0.5) and out[0, 7] == -(0.25 + 0.5)
    assert out[0, 0] == 0 and bool((out[1] == 0).all())
    assert out is not logits
    plain = [state(0.0, 0.0, [1, 2])]
    assert plain[0].counts is None  # no counting without penalties
    assert torch.equal(penalize(logits[:1], plain), logits[:1])


def test_logit_bias_is_added_at_every_position() -> None:
    torch.manual_seed(1)
    biased = RequestState(0, 0, SamplingSpec(0.0, 1.0, 0, 0,
                                             logit_bias=((2, -100.0), (9, 3.5))))  # fmt: skip
    record([biased], [[2]], VOCAB, torch.device("cpu"))
    plain = state(0.0, 0.0, [])
    assert biased.counts is None  # nothing to count: logit_bias needs no completion
    logits = torch.randn(2, VOCAB)
    out = penalize(logits, [biased, plain])
    want = logits[0].clone()
    want[2] -= 100.0
    want[9] += 3.5
    torch.testing.assert_close(out[0], want, rtol=0, atol=0)
    assert torch.equal(out[1], logits[1])
    tree_logits = torch.randn(2, 3, VOCAB)
    tokens = torch.tensor([[1, 2, 9], [1, 1, 1]])
    valid = torch.ones(2, 3, dtype=torch.bool)
    layout = tree_attention_mask(torch.tensor([[-1, 0, 1], [-1, 0, 1]]), valid)
    got = penalize_tree(tree_logits, [biased, plain], tokens, valid, layout.ancestors)
    for i in range(3):
        torch.testing.assert_close(got[0, i], penalize(tree_logits[0, i][None], [biased])[0])
    assert torch.equal(got[1], tree_logits[1])
    both = RequestState(0, 0, SamplingSpec(0.0, 1.0, 0, 0, 0.5, 0.0, logit_bias=((2, 1.0),)))
    record([both], [[2]], VOCAB, torch.device("cpu"))
    assert penalize(torch.zeros(1, VOCAB), [both])[0, 2] == 1.0 - 0.5  # the bias, the presence
