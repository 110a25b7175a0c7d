"""Type checks of JSON values in OpenAI bodies (a bool is not a number here)."""

from __future__ import annotations

import sys
from typing import Any

_FLOAT_MAX = int(sys.float_info.max)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_int64(value: Any) -> bool:
    return is_int(value) and -(1 << 63) <= value < (1 << 63)


def is_number(value: Any) -> bool:
    """A JSON number that a float holds: an integer past float's range (10**400) is not one,
    so that float(value) cannot raise OverflowError where a 400 is due."""
    if isinstance(value, float):
        return True
    return is_int(value) and abs(value) <= _FLOAT_MAX

