"""router.stop: stop strings over text that arrives in arbitrary pieces."""

import random

import pytest

from router.stop import StopMatcher, StopResult


def run(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    """Push every piece; return (all emitted text incl. flush, matched stop or None)."""
    matcher = StopMatcher(stops)
    emitted, matched = [], None
    for piece in pieces:
        result = matcher.push(piece)
        emitted.append(result.text)
        if result.stopped:
            matched = result.matched
            break
    emitted.append(matcher.flush())
    return "".join(emitted), matched


def test_no_stop_strings_passes_everything_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("hello") == StopResult("hello", False, None)
    assert matcher.flush() == ""


def test_no_match_emits_everything_eventually() -> None:
    assert run(["STOP"], ["hel", "lo S", "TO", "p and more ST"]) == ("hello STOp and more ST", None)


def test_match_in_one_piece() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.push("answer</s>junk") == StopResult("answer", True, "</s>")
    assert matcher.push("more") == StopResult("", True, "</s>")
    assert matcher.flush() == ""
    assert matcher.stopped


def test_stop_split_across_pushes_is_held_back() -> None:
    matcher = StopMatcher(["###"])
    assert matcher.push("abc#") == StopResult("abc", False, None)
    assert matcher.push("#") == StopResult("", False, None)
    assert matcher.push("#tail") == StopResult("", True, "###")


def test_held_text_released_when_match_fails() -> None:
    matcher = StopMatcher(["###"])
    assert matcher.push("a##") == StopResult("a", False, None)
    assert matcher.push("b") == StopResult("##b", False, None)


def test_overlapping_prefix_restarts_inside_held_text() -> None:
    # "aab" fails "aaa" at the 3rd char, but its tail "a" + next "aa" matches.
    assert run(["aaa"], ["a", "a", "b", "a", "a", "a", "x"]) == ("aab", "aaa")
    assert run(["abab"], ["ab", "a", "abab"]) == ("aba", "abab")


def test_held_back_is_longest_possible_prefix() -> None:
    matcher = StopMatcher(["hello", "lol"])
    assert matcher.push("xhel").text == "x"  # "hel" could still become "hello"
    assert matcher.push("l").text == ""  # "hell" too
    assert matcher.push("x") == StopResult("hellx", False, None)
    assert matcher.push("lo").text == ""  # "lo" could become "lol"
    assert matcher.push("l") == StopResult("", True, "lol")


def test_earliest_of_several_stop_strings_wins() -> None:
    assert run(["END", "STOP"], ["go STOP then END"]) == ("go ", "STOP")
    assert run(["END", "STOP"], ["go EN", "D then STOP"]) == ("go ", "END")
    assert run(["\n\n", "User:"], ["Hi.\nUser:", " x\n\n"]) == ("Hi.\n", "User:")


def test_first_completed_wins_for_nested_stop_strings() -> None:
    # "bc" completes before "abcd" does, whatever the chunking.
    for pieces in (["abcd"], ["a", "b", "c", "d"], ["ab", "cd"]):
        assert run(["abcd", "bc"], pieces) == ("a", "bc")
    # Same end, the longer one starts earlier and wins.
    assert run(["bc", "abc"], ["xabc"]) == ("x", "abc")


def test_empty_stop_strings_are_ignored() -> None:
    assert run(["", "Z"], ["abc"]) == ("abc", None)


def test_unicode_stop_strings() -> None:
    assert run(["。"], ["日本語", "です。", "次"]) == ("日本語です", "。")


@pytest.mark.parametrize("seed", range(20))
def test_result_does_not_depend_on_chunking(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice("ab#\n") for _ in range(60))
    stops = ["#a#", "\n\n", "bba"]
    whole = run(stops, [text])
    cuts = sorted(rng.sample(range(1, len(text)), 10))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert run(stops, pieces) == whole
    assert run(stops, list(text)) == whole
