"""Stop strings over streamed text.

Text arrives in arbitrary pieces, so a stop string can straddle pieces. The matcher holds back
the longest tail of the text that is still a proper prefix of some stop string; everything before
it can never become part of a match and is safe to emit. Held text is shorter than the longest
stop string, so each `push` costs O((len(new_text) + max_stop_len) * num_stops).
"""

from collections.abc import Sequence
from typing import NamedTuple


class StopResult(NamedTuple):
    """What one `push` yields: `text` is safe to emit now; `matched` is set iff `stopped`."""

    text: str
    stopped: bool
    matched: str | None


class StopMatcher:
    """Finds the first stop string in a text stream, holding back possible partial matches.

    The stop string that *completes* first in the stream wins (on a tie, the longer one, which
    starts earlier). That is the rule a character-by-character stream would apply, so the result
    does not depend on how the text is cut into pieces. Empty stop strings are ignored. After a
    stop, every `push` returns ("", True, matched) and `flush` returns "".
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop_strings if s))
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._matched: str | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings matched for (empty ones dropped): none, and ``push`` passes text
        through as it comes."""
        return self._stops

    @property
    def stopped(self) -> bool:
        """Whether a stop string has matched."""
        return self._matched is not None

    def push(self, new_text: str, may_stop: bool = True) -> StopResult:
        """Feed the next piece of text; see `StopResult`. ``may_stop`` False (min_tokens not
        reached): a complete match passes through as text; a partial one at the end is still
        held, so a stop string that completes once stopping is allowed is found."""
        if self._matched is not None:
            return StopResult("", True, self._matched)
        text = self._held + new_text
        match = self._first_match(text) if may_stop else None
        if match is not None:
            start, self._matched = match
            self._held = ""
            return StopResult(text[:start], True, self._matched)
        cut = len(text) - self._partial_len(text)
        self._held = text[cut:]
        return StopResult(text[:cut], False, None)

    def flush(self) -> str:
        """Text held back as a possible partial match; the stream ended, so it is safe now."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        # Held text holds no complete match, so any match here ends inside the new text.
        best: tuple[int, int, str] | None = None  # (end, -len, stop) orders by completion
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0:
                candidate = (start + len(stop), -len(stop), stop)
                best = candidate if best is None else min(best, candidate)
        return None if best is None else (best[0] + best[1], best[2])

    def _partial_len(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        for n in range(min(len(text), self._max_hold), 0, -1):
            if text[-n:] in self._prefixes:
                return n
        return 0
