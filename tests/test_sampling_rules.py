"""min_p, repetition_penalty and min_tokens on the target, checked against HF transformers' own
processors: sequentially, and at every verified tree node with the context sequential decoding
would have there (committed context + the drafts on the node's path)."""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
)

from model_runtime.sampling import SamplingTensors, filtered_probs
from target_service.penalties import bans_now, has_penalty, penalize, penalize_tree, record
from target_service.request_table import RequestState, SamplingSpec
from target_service.tree import tree_attention_mask
from tests.test_penalties import path_to

VOCAB = 12
EOS, STOP = 11, 4
CPU = torch.device("cpu")
PARENTS = [[-1, 0, 0, 1, 1, 3, 2], [-1, 0, 1, 2, 0, 0, 0]]
TOKENS = torch.tensor([[4, 5, 5, 7, 4, 5, 9], [1, 1, 11, 4, 2, 3, 0]])
VALID = torch.tensor([[True] * 7, [True] * 6 + [False]])


def params(temperature: float, top_p: float, top_k: int, min_p: float) -> SamplingTensors:
    def one(x: float | int) -> torch.Tensor:
        return torch.tensor([x])

    return SamplingTensors(one(temperature), one(top_p), one(top_k), one(0), one(0), one(min_p))


def tree_layout():
    parents = torch.tensor(PARENTS)
    parents[1, 6] = 0  # padding
    return tree_attention_mask(parents, VALID)


def test_min_p_matches_hf_after_temperature() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 50) * 3
    for temperature, min_p in ((1.0, 0.05), (0.7, 0.2), (1.5, 0.5), (1.0, 1.0)):
        scaled = TemperatureLogitsWarper(temperature)(None, logits.clone())
        want = torch.softmax(MinPLogitsWarper(min_p)(None, scaled), -1)
        got = filtered_probs(logits, params(temperature, 1.0, 0, min_p))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    off = filtered_probs(logits, params(0.8, 1.0, 0, 0.0))
    torch.testing.assert_close(off, torch.softmax(logits / 0.8, -1), rtol=1e-6, atol=1e-7)


def test_min_p_intersects_top_k_and_top_p_on_one_distribution() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]]))
    # top_k 4 keeps 0-3, top_p 0.9 keeps 0-3 (mass before 3 is 0.85), min_p 0.3 keeps >= 0.12
    got = filtered_probs(logits, params(1.0, 0.9, 4, 0.3))[0]
    want = torch.tensor([0.4, 0.3, 0.15, 0.0, 0.0]) / 0.85
    torch.testing.assert_close(got, want)
    greedy = filtered_probs(logits, params(0.0, 1.0, 0, 1.0))[0]
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_rows_without_top_k_or_top_p_skip_the_sort_with_the_same_bits() -> None:
    """The sort-free path (no row ranks the vocabulary) gives what the sort gives such rows,
    bit for bit, min_p or not: a request draws alike whatever filters its batch holds. And a
    top_p of 1 cuts nothing, even where the rounded cumulative sum reaches 1 early."""
    torch.manual_seed(1)
    logits = torch.randn(4, 49152) * 4
    rows = SamplingTensors(
        torch.tensor([1.0, 0.7, 1.3, 1.0]),
        torch.ones(4),
        torch.zeros(4, dtype=torch.long),
        torch.zeros(4, dtype=torch.long),
        torch.zeros(4, dtype=torch.long),
        torch.tensor([0.0, 0.0, 0.05, 1e-4]),
    )
    sort_free = filtered_probs(logits, replace(rows, ranked=False))
    assert torch.equal(sort_free, filtered_probs(logits, rows))
    assert bool((sort_free[:2] > 0).all())  # every id keeps its mass without min_p
    assert bool((sort_free[2:] == 0).any())  # min_p did cut


def rep_state(penalty: float, context: list[int], sampled: list[int]) -> RequestState:
    s = RequestState(0, 0, SamplingSpec(0.0, 1.0, 0, 0, repetition_penalty=penalty,
                                        repetition_context=tuple(context)))  # fmt: skip
    record([s], [sampled], VOCAB, CPU)
    return s


def test_repetition_matches_hf_over_prompt_and_completion() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, VOCAB) * 4
    prompt, completion = [3, 3, 8], [1, 8, 10]
    states = [rep_state(1.3, prompt, completion), rep_state(0.6, [2], [])]
    got = penalize(logits, states)
    for row, (penalty, ids) in enumerate(((1.3, prompt + completion), (0.6, [2]))):
        want = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([ids]), logits[row : row + 1])
        torch.testing.assert_close(got[row : row + 1], want, rtol=0, atol=0)
    plain = rep_state(1.0, prompt, completion)
    assert not has_penalty(plain) and torch.equal(penalize(logits[:1], [plain]), logits[:1])


def test_repetition_tree_nodes_see_their_own_path() -> None:
    torch.manual_seed(2)
    layout = tree_layout()
    contexts = [([3, 5], [6]), ([8], [1, 0])]
    states = [rep_state(1.7, *contexts[0]), rep_state(0.8, *contexts[1])]
    logits = torch.randn(2, 7, VOCAB) * 3
    got = penalize_tree(logits, states, TOKENS, VALID, layout.ancestors)
    for b, (prompt, completion) in enumerate(contexts):
        for i in range(7):
            if not VALID[b, i]:
                continue
            ids = prompt + completion + [int(TOKENS[b, j]) for j in path_to(PARENTS[b], i)]
            processor = RepetitionPenaltyLogitsProcessor(states[b].sampling.repetition_penalty)
            want = processor(torch.tensor([ids]), logits[b, i][None].clone())[0]
            torch.testing.assert_close(got[b, i], want, rtol=0, atol=0)


def min_state(min_tokens: int, sampled: list[int]) -> RequestState:
    spec = SamplingSpec(0.0, 1.0, 0, 0, min_tokens=min_tokens, min_tokens_banned_ids=(EOS, STOP))
    s = RequestState(0, 0, spec)
    record([s], [sampled], VOCAB, CPU)
    return s


def hf_min_tokens(min_tokens: int, prompt_len: int, num_done: int, logits: torch.Tensor):
    processor = MinNewTokensLengthLogitsProcessor(prompt_len, min_tokens, [EOS, STOP])
    return processor(torch.zeros(1, prompt_len + num_done, dtype=torch.long), logits[None])[0]


def test_min_tokens_matches_hf_until_met() -> None:
    torch.manual_seed(3)
    logits = torch.randn(VOCAB)
    for done in range(5):
        s = min_state(3, [0] * done)
        assert bans_now(s) == (done < 3) and has_penalty(s) == (done < 3)
        got = penalize(logits[None], [s])[0]
        torch.testing.assert_close(got, hf_min_tokens(3, 5, done, logits), rtol=0, atol=0)
    unbanned = RequestState(0, 0, SamplingSpec(0.0, 1.0, 0, 0, min_tokens=3))  # ignore_eos, no ids
    assert not has_penalty(unbanned)


def test_min_tokens_tree_nodes_are_banned_by_their_depth() -> None:
    torch.manual_seed(4)
    layout = tree_layout()
    states = [min_state(3, [7]), min_state(2, [])]  # 2 and 2 tokens still owed
    logits = torch.randn(2, 7, VOCAB)
    got = penalize_tree(logits, states, TOKENS, VALID, layout.ancestors)
    for b, st in enumerate(states):
        for i in range(7):
            if not VALID[b, i]:
                continue
            done = st.num_sampled + len(path_to(PARENTS[b], i))
            want = hf_min_tokens(st.sampling.min_tokens, 4, done, logits[b, i])
            torch.testing.assert_close(got[b, i], want, rtol=0, atol=0)
    assert bool(torch.isinf(got[0, 0, EOS])) and not bool(torch.isinf(got[0, 3, EOS]))
