"""Shared pieces of the speculative-decoding tests (tests/test_spec_*.py).

- A tiny random Llama written as a HF-style folder (config.json, model.safetensors and the
  default model's tokenizer, chat template and EOS), so target, drafters and router load it like
  any checkpoint and fp64 makes greedy outputs exactly comparable.
- Stacks of real processes (target, draft replicas, router) on that model.
- A small gRPC client that keeps every stream item, and request builders.

Fixtures (``*_fixture``, used under their ``name``) are imported into the test modules that use
them. Model folders are built once per pytest run (keyed by shape), whichever module asks first.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import pytest

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from router.tokenizer import Tokenizer
from splitspec.grpc_util import CHANNEL_OPTIONS
from splitspec.launcher import LocalStack

START_TIMEOUT_S = 300.0
GENERATE_TIMEOUT_S = 240.0
UNARY_TIMEOUT_S = 10.0
FP64 = ["--device", "cpu", "--dtype", "float64"]


# ---- the tiny model ------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyLlama:
    """Shape of a random Llama. vocab_size 49152 matches the default tokenizer."""

    vocab_size: int = 49152
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position: int = 2048
    tie_word_embeddings: bool = False
    seed: int = 0
    layer_scale: float = 1.0  # scales o_proj and down_proj: how far a layer moves the residual
    logit_scale: float = 1.0  # scales lm_head: how peaked next-token distributions are
    with_tokenizer: bool = True

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def hf_config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "float32",
        }


def write_tiny_llama(shape: TinyLlama, out_dir: Path) -> Path:
    """Writes the model folder atomically (a temporary folder renamed into place)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from model_runtime.config import ModelConfig
    from model_runtime.llama import LlamaForCausalLM

    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(shape.hf_config(), indent=2))
    config = ModelConfig.from_hf(AutoConfig.from_pretrained(tmp), name="tiny-llama")
    torch.manual_seed(shape.seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2)  # not all ones, so the norms matter
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(shape.layer_scale)
            elif name == "lm_head.weight":
                param.mul_(shape.logit_scale)
    state = {
        k: v.detach().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("rotary")
    }
    if shape.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, tmp / "model.safetensors")
    if shape.with_tokenizer:
        export_default_tokenizer(tmp)
    os.replace(tmp, out_dir)
    return out_dir


def export_default_tokenizer(out_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json (chat template, BOS, EOS) of the default model."""
    from model_runtime.loading import default_model_path
    from router.gguf_tokenizer import load_gguf_tokenizer

    gguf = load_gguf_tokenizer(str(default_model_path()))
    gguf.backend.save(str(out_dir / "tokenizer.json"))
    config = {
        "bos_token": gguf.backend.id_to_token(gguf.bos_token_id),
        "eos_token": gguf.backend.id_to_token(gguf.eos_token_id),
        "chat_template": gguf.chat_template,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def tiny_llama_dir(root: Path, shape: TinyLlama = TinyLlama()) -> Path:
    """The model folder for ``shape`` under ``root``, built on first use."""
    out_dir = root / f"tiny-llama-{shape.key()}"
    if not (out_dir / "config.json").is_file():
        write_tiny_llama(shape, out_dir)
    return out_dir


def write_oracle_head(model_dir: Path, head_dir: Path) -> Path:
    """An EAGLE head that re-runs a ONE-layer target: fc = [I | 0] feeds the token embedding
    through, and the head's layer is the target's layer. Its features then equal the target's
    hidden states up to two differences: the head never sees the context's first token (it reads
    x_{t+1}), and RoPE runs one position lower (attention is shift-invariant). So it drafts the
    target's own greedy continuation most of the time, not always: the EAGLE tree accepts long
    paths, through first and later children."""
    import torch
    from safetensors.torch import load_file

    from draft_service.eagle.head import random_head, save_head

    head = random_head(model_dir, seed=0, dtype=torch.float64)
    target = load_file(model_dir / "model.safetensors")
    hidden = head.hidden_size
    assert head.config.target.num_layers == 1, "the oracle head copies a one-layer target"
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1))
        head.fc.bias.zero_()
        for name, param in head.layers[0].named_parameters():
            param.copy_(target[f"model.layers.0.{name}"])
    save_head(head, head_dir)
    return head_dir


# The end-to-end model: one layer (so `write_oracle_head` can copy it), layers strong enough that
# greedy outputs fall into loops now and then (prompt lookup gets accepted), and a sharp enough
# LM head that EAGLE-2 trees grow deep.
E2E_MODEL = TinyLlama(
    hidden_size=32, intermediate_size=64, num_layers=1, layer_scale=5.0, logit_scale=10.0
)


@pytest.fixture(scope="session", name="tiny_model_dir")
def tiny_model_dir_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """E2E_MODEL's folder (vocabulary 49152, the default model's tokenizer)."""
    return tiny_llama_dir(tmp_path_factory.getbasetemp(), E2E_MODEL)


@pytest.fixture(scope="session", name="oracle_head_dir")
def oracle_head_dir_fixture(tiny_model_dir: Path) -> Path:
    """A `write_oracle_head` EAGLE head for E2E_MODEL."""
    head_dir = tiny_model_dir.with_name(tiny_model_dir.name + "-oracle-head")
    if not (head_dir / "eagle_config.json").is_file():
        write_oracle_head(tiny_model_dir, head_dir)
    return head_dir


# ---- stacks ------------------------------------------------------------------------------


def start_stack(
    log_dir: Path,
    model_dir: Path,
    drafts: Sequence[Sequence[str]] = (),
    target_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    router_model_dir: Path | None = None,
) -> LocalStack:
    """Target, draft replicas and router on ``model_dir`` in fp64 on the CPU.

    Each draft entry is a replica's own arguments (``--method ...``); eagle replicas get the
    model and dtype here. The router reads its tokenizer from ``router_model_dir`` when given
    (e.g. one with other EOS ids). Returns once the router sees every replica healthy.
    """
    draft_args = []
    for args in drafts:
        args = list(args)
        if "eagle" in args:
            args += ["--model", str(model_dir), *FP64]
        draft_args.append(args)
    stack = LocalStack(
        ["--model", str(model_dir), *FP64, "--threads", "1", *target_args],
        ["--model", str(router_model_dir or model_dir), *router_args],
        log_dir=log_dir,
        draft_args=draft_args,
    )
    return stack.start(timeout_s=START_TIMEOUT_S)


@contextlib.contextmanager
def running_stack(
    log_dir: Path,
    model_dir: Path,
    drafts: Sequence[Sequence[str]] = (),
    target_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    router_model_dir: Path | None = None,
) -> Iterator[tuple[LocalStack, Router]]:
    """A started stack and a client of its router; both closed on exit, whatever happened."""
    stack = start_stack(log_dir, model_dir, drafts, target_args, router_args, router_model_dir)
    router = Router(stack.router_address)
    try:
        yield stack, router
    finally:
        router.close()
        stack.stop()


# ---- the client ----------------------------------------------------------------------------


@dataclass
class Stream:
    """Every item of one Generate stream."""

    items: list[pb.GenerateResponse] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return [t for item in self.items for t in item.token_ids]

    @property
    def text(self) -> str:
        return "".join(item.text for item in self.items)

    @property
    def final(self) -> pb.GenerateResponse:
        assert self.items, "the stream had no items"
        return self.items[-1]

    @property
    def blocks(self) -> list[list[int]]:
        """Token ids per item: one committed block each (items without tokens skipped)."""
        return [list(item.token_ids) for item in self.items if item.token_ids]


class Router:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def generate(
        self, request: pb.GenerateRequest, timeout_s: float = GENERATE_TIMEOUT_S
    ) -> Stream:
        stream = Stream()
        for item in self.stub.Generate(request, timeout=timeout_s):
            stream.items.append(item)
        return stream

    def generate_many(
        self, requests: Sequence[pb.GenerateRequest], timeout_s: float = GENERATE_TIMEOUT_S
    ) -> list[Stream]:
        """All at once, one thread each; streams in request order."""
        with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
            futures = [pool.submit(self.generate, r, timeout_s) for r in requests]
            return [f.result() for f in futures]

    def status(self) -> pb.ServerStatus:
        return self.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=UNARY_TIMEOUT_S)


def ids_request(
    ids: Sequence[int],
    max_new_tokens: int,
    speculate: bool,
    *,
    request_id: str = "",
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    ignore_eos: bool = False,
) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=request_id)
    req.input_ids.ids.extend(ids)
    req.sampling.max_new_tokens = max_new_tokens
    req.sampling.temperature = temperature
    req.sampling.top_k = top_k
    req.sampling.top_p = top_p
    req.sampling.stop.extend(stop)
    req.sampling.stop_token_ids.extend(stop_token_ids)
    req.sampling.ignore_eos = ignore_eos
    if seed is not None:
        req.sampling.seed = seed
    req.speculation.enabled = speculate
    return req


# ---- text ----------------------------------------------------------------------------------


def stop_string_at(tokenizer: Tokenizer, ids: list[int], end: int) -> str | None:
    """The shortest text of ids[start : end + 1] whose first occurrence in the output's text
    completes with token ``end``; None when there is none. In a loop of period P the string
    has to reach back before the loop, so it can be longer than P tokens."""
    upto = tokenizer.decode(ids[: end + 1])
    if "\ufffd" in upto:
        return None
    text_before_end = tokenizer.decode(ids[:end])
    for start in range(end - 1, max(end - 64, 0) - 1, -1):
        before = tokenizer.decode(ids[:start])
        if not upto.startswith(before):
            continue
        stop = upto[len(before) :]
        first_at_end = upto.find(stop) == len(upto) - len(stop)
        if stop.strip() and first_at_end and text_before_end.find(stop) < 0:
            return stop
    return None


# ---- in-process references ----------------------------------------------------------------


@functools.cache
def load_fp64(model_dir: Path):  # -> LlamaForCausalLM (torch imported lazily); shared, eval only
    import torch

    from model_runtime.loading import load_model

    return load_model(model_dir, torch.float64, torch.device("cpu"), model_dir)


def greedy_reference(
    model_dir: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy continuations (EOS ignored) from a TargetEngine in this process, fp64."""
    from target_service.config import TargetConfig
    from target_service.engine import StepItem, TargetEngine
    from target_service.request_table import SamplingSpec

    total = sum(len(p) + max_new_tokens for p in prompts)
    config = TargetConfig(
        model_path=model_dir,
        cache_dir=model_dir,
        dtype="float64",
        num_slots=total,
        max_requests=len(prompts),
        max_batch_tokens=total,
    )
    engine = TargetEngine(config, load_fp64(model_dir))
    rids = [f"ref-{i}" for i in range(len(prompts))]
    first, items = 0, []
    for rid, prompt in zip(rids, prompts, strict=True):
        size = len(prompt) + max_new_tokens
        items.append(
            StepItem(
                rid,
                list(prompt),
                0,
                list(range(first, first + size)),
                True,
                SamplingSpec(0.0, 1.0, 0, 0),
            )
        )
        first += size
    out = [[t] for t in engine.forward(items).next_token_ids]
    for step in range(1, max_new_tokens):
        items = [
            StepItem(rid, [ids[-1]], len(p) + step - 1, [], True)
            for rid, p, ids in zip(rids, prompts, out, strict=True)
        ]
        for ids, token in zip(out, engine.forward(items).next_token_ids, strict=True):
            ids.append(token)
    return out


def hidden_states(model_dir: Path, ids: Sequence[int]):  # -> torch.Tensor [len(ids), hidden]
    """The target's hidden rows of ``ids`` (last layer, before the final norm) from one plain
    causal forward of the model in this process, on fresh pools."""
    import torch

    from model_runtime.attention import build_metadata
    from model_runtime.pools import SlotPools

    model = load_fp64(model_dir)
    num = len(ids)
    pools = SlotPools(model.config, num, torch.float64, torch.device("cpu"))
    slots = torch.arange(num)
    meta = build_metadata(slots, slots[None, :], torch.tensor([0]), torch.tensor([num]), num)
    with torch.inference_mode():
        return model(torch.tensor(list(ids)), slots, (pools.k, pools.v), meta)


# ---- prompts -------------------------------------------------------------------------------


def random_prompts(seed: int, count: int, vocab_size: int, max_len: int = 300) -> list[list[int]]:
    """Prompts of 1..max_len random ids; every third one repeats a short random phrase, so a
    prompt-lookup drafter finds matches. Lengths include both extremes."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        length = 1 if i == 0 else max_len if i == 1 else rng.randint(1, max_len)
        if i % 3 == 2:
            phrase = [rng.randrange(vocab_size) for _ in range(rng.randint(2, 12))]
            ids = (phrase * (length // len(phrase) + 1))[:length]
        else:
            ids = [rng.randrange(vocab_size) for _ in range(length)]
        prompts.append(ids)
    return prompts
