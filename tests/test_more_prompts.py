"""More training prompts: every user turn with its history, and HumanEval-style code stubs from
the conversations' Python functions and from library code; held-out conversations never feed
training."""

from __future__ import annotations

from itertools import count

from draft_service.eagle.train.data import HUMANEVAL_INSTRUCTION, is_heldout
from draft_service.eagle.train.more_prompts import (
    Dialogue,
    code_messages,
    documented_functions,
    extra_train_prompts,
    function_stubs,
    to_dialogue,
    turn_prompts,
)

BLOCK = '''import os
from typing import List


def total(xs: List[int]) -> int:
    """Sum of xs."""
    result = 0
    for x in xs:
        result += x
    return result


class Box:
    def area(self, w, h):
        # width times height
        a = w * h
        return a

    def one(self): return 1
'''


class WordTokenizer:
    """A stand-in for ChatTokenizer: one id per whitespace-separated word, plus one per message."""

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        words = sum(len(m["content"].split()) + 1 for m in messages)
        return list(range(words + int(add_generation_prompt)))

    def prompt(self, user: str) -> list[int]:
        return self.chat([{"role": "user", "content": user}], True)


def record(conv_id: str, *texts: str) -> dict:
    roles = ["human", "gpt"]
    return {"id": conv_id, "conversations": [{"from": roles[i % 2], "value": t}
                                             for i, t in enumerate(texts)]}


def heldout_id() -> str:
    return next(f"c{i}" for i in count() if is_heldout(f"c{i}"))


def test_dialogue_stops_where_the_turns_stop_alternating() -> None:
    raw = record("a", "hi", "hello", "more", "sure")
    raw["conversations"].insert(2, {"from": "gpt", "value": "again"})
    dialogue = to_dialogue(raw)
    assert dialogue is not None
    assert [m["content"] for m in dialogue.messages] == ["hi", "hello"]
    assert to_dialogue(record("b", "   ", "x")) is None


def test_every_turn_with_its_history_until_too_long() -> None:
    dialogue = to_dialogue(record("a", "one", "two three", "four", "five six seven", "a " * 50))
    assert dialogue is not None
    prompts = list(turn_prompts(WordTokenizer(), dialogue, max_prompt_len=20, max_chars=10_000))
    assert [n for n, _ in prompts] == ["a", "a:1"]  # the third turn is over 20 "tokens"
    assert prompts[1][1] == WordTokenizer().chat(dialogue.messages[:3], True)
    assert list(turn_prompts(WordTokenizer(), dialogue, 20, max_chars=2)) == []


def test_function_stubs_keep_imports_signature_and_spec() -> None:
    stubs = dict(function_stubs(BLOCK))
    assert set(stubs) == {"total", "area"}  # `one` has nothing left to write
    assert stubs["total"] == ('import os\nfrom typing import List\n\n\n'
                              'def total(xs: List[int]) -> int:\n    """Sum of xs."""\n')
    assert stubs["area"].endswith("def area(self, w, h):\n    # width times height\n")
    assert list(function_stubs("def broken(:\n")) == []


def test_code_messages_are_humaneval_shaped_distinct_and_filtered() -> None:
    text = f"Here:\n```python\n{BLOCK}```\nand again\n```\n{BLOCK}```"
    dialogues = [Dialogue("a", [{"role": "user", "content": "?"},
                                {"role": "assistant", "content": text}])]
    messages = list(code_messages(dialogues, banned_names={"area"}))
    assert [n for n, _ in messages] == ["a:code0"]
    assert messages[0][1].startswith(HUMANEVAL_INSTRUCTION.split("{")[0])


def test_documented_functions_skip_private_and_undocumented() -> None:
    source = BLOCK + '\n\ndef _hidden(x):\n    """No."""\n    y = x\n    return y\n'
    assert [n for n, _ in documented_functions(source, max_doc_lines=5)] == ["total"]


def test_held_out_conversations_never_become_training_prompts() -> None:
    code = f"```python\n{BLOCK}```"
    held = heldout_id()
    dialogues = [to_dialogue(record(i, "question", code, "follow up")) for i in ("t1", held)]
    sets = extra_train_prompts(WordTokenizer(), 512, 512, dialogues=dialogues,  # type: ignore[arg-type]
                               banned_names=set())
    assert sets["turns"].names == ["t1", "t1:1"]
    assert sets["code"].names == ["t1:code0", "t1:code1"]
