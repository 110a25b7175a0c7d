"""Type checks of JSON values in OpenAI bodies (a bool is not a number here)."""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_int64(value: Any) -> bool:
    return is_int(value) and -(1 << 63) <= value < (1 << 63)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
