"""Mistyped flags answered with the flag meant.

argparse refuses an unknown flag with "unrecognized arguments" alone, and said by the top-level
parser even when the flag was meant for a subcommand. ``HintingParser`` says it with the
subcommand's usage and adds the closest flag that command has: `splitspec generate --max-tokens
5` (the OpenAI name) is answered "--max-tokens: did you mean --max-new-tokens?".

It takes no abbreviations either: argparse's default reads `--max 5` as the one flag that
starts so, which a script then depends on without knowing, until a second flag of that prefix
arrives and the same line fails as ambiguous. A shortened flag is refused with the whole one.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

CLOSE_ENOUGH = 0.6  # difflib's ratio: --max-tokens against --max-new-tokens is 0.79
# Names other tools give the flag that says where a server is; spelt nothing like --address.
OTHER_NAMES = {name: "--address" for name in ("--router", "--url", "--server", "--endpoint")}


def closest_flag(parser: argparse.ArgumentParser, name: str) -> str | None:
    """The flag of ``parser`` that other tools name ``name``, if it has one, else its long
    flag nearest to ``name``, if one is near enough (bench's --out is to --router)."""
    flags = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    if OTHER_NAMES.get(name) in flags:
        return OTHER_NAMES[name]
    close = difflib.get_close_matches(name, flags, n=1, cutoff=CLOSE_ENOUGH)
    return close[0] if close else None


def unrecognized(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """argparse's message for ``unknown``, with a guess for each mistyped long flag."""
    hints = []
    for token in unknown:
        name = token.split("=", 1)[0]
        if name.startswith("--") and (meant := closest_flag(parser, name)):
            hints.append(f"{name}: did you mean {meant}?")
    return "; ".join([f"unrecognized arguments: {' '.join(unknown)}", *hints])


class HintingParser(argparse.ArgumentParser):
    """Refuses unknown arguments through the subcommand they followed, with ``unrecognized``'s
    guesses. Its subcommands' parsers are of this class too (argparse's default)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = self._command_parser(parsed)
            command.error(unrecognized(command, unknown))
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest, None)
                chosen = action.choices.get(name) if name else None
                if isinstance(chosen, HintingParser):
                    return chosen._command_parser(parsed)
                if chosen is not None:
                    return chosen
        return self
