"""The key/value metadata of a GGUF file (its header), read with `struct` alone.

The router needs only the tokenizer's fields. gguf's GGUFReader builds a numpy view for every
element of every array (about 150k for SmolLM2's vocabulary and merges): 2-4 s of CPU at each
router start on a 2-core box. Decoding the same bytes with `struct` takes a tenth of a second.
Layout (GGUF v2/v3, little-endian): magic "GGUF", uint32 version, uint64 tensor count, uint64
key/value count, then each pair as a string key, a uint32 value type and the value.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
STRING, ARRAY = 8, 9
# Value type -> struct format of one scalar (GGUF's GGUFValueType numbering).
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}


class _Cursor:
    """Reads GGUF values from a byte buffer, front to back."""

    def __init__(self, data: mmap.mmap, path: str) -> None:
        self.data, self.path, self.offset = data, path, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("Q")
        start = self.offset
        self.offset += length
        if self.offset > len(self.data):
            raise ValueError(f"{self.path}: GGUF header ends inside a string")
        return self.data[start : self.offset].decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind, count = self.scalar("I"), self.scalar("Q")
            if item_kind in SCALARS:  # one unpack for the whole array
                fmt = f"<{count}{SCALARS[item_kind]}"
                items = list(struct.unpack_from(fmt, self.data, self.offset))
                self.offset += struct.calcsize(fmt)
                return items
            return [self.value(item_kind) for _ in range(count)]
        if kind in SCALARS:
            return self.scalar(SCALARS[kind])
        raise ValueError(f"{self.path}: unknown GGUF value type {kind}")


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """Every key/value pair of the GGUF file at ``path``, as Python values (arrays as lists);
    only the header's pages are read (the file is mapped, not loaded)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            return _read_fields(_Cursor(data, path))
        except struct.error as err:  # a value runs past the end of the file
            raise ValueError(f"{path}: truncated GGUF header ({err})") from err


def _read_fields(cursor: _Cursor) -> dict[str, Any]:
    path = cursor.path
    if cursor.data[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
    cursor.offset = 4
    version = cursor.scalar("I")
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    cursor.scalar("Q")  # tensor count: the tensors follow the metadata, unread here
    count = cursor.scalar("Q")
    fields: dict[str, Any] = {}
    for _ in range(count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.scalar("I"))
    return fields

