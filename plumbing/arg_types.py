"""argparse types for numeric flags, so that a value out of range is a usage error naming the
flag (`argument --max-running: must be >= 1, got 0`) instead of a service that starts and then
hangs, refuses everything or times out at once."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def number_at_least(
    kind: type[int] | type[float], minimum: float, exclusive: bool = False
) -> Callable[[str], int | float]:
    sign = ">" if exclusive else ">="

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
            if value != value:  # nan: compares false with every bound
                raise ValueError(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}"
            ) from None
        if value < minimum or (exclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {sign} {minimum:g}, got {text}")
        return value

    return parse


def int_between(minimum: int, maximum: int) -> Callable[[str], int]:
    """An integer in [minimum, maximum]: a request field's range (a proto's uint32 is at most
    2**32 - 1), so that a value past it is a usage error, not protobuf's ValueError."""
    at_least = number_at_least(int, minimum)

    def parse(text: str) -> int:
        value = int(at_least(text))
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {text}")
        return value

    return parse


def port(text: str) -> int:
    value = number_at_least(int, 0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {text}")
    return int(value)


POSITIVE_INT = number_at_least(int, 1)
NON_NEGATIVE_INT = number_at_least(int, 0)
POSITIVE_FLOAT = number_at_least(float, 0, exclusive=True)
TREE_TOKENS = number_at_least(int, 2)  # a draft tree's nodes: the root and at least one draft


def utf8_text(text: str) -> str:
    """Text a request field can carry: argv's bytes that are not UTF-8 arrive as lone
    surrogates, which protobuf refuses with a traceback while the request is built."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 (at {err.start})") from None
    return text
