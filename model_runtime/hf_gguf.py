"""transformers' GGUF loading without its repeated work: the same result in about half the time.

``from_pretrained(..., gguf_file=...)`` parses the file's header twice (once for the config, once
for the weights; a tokenizer load parses it again), and builds gguf's tensor-name table once per
module of the model (397 times for SmolLM2): 15 of its 25 s on a loaded 2-core box. Inside
``memoized_gguf_reads()`` each is built once per file and arguments, and the header is parsed
on a plain ndarray view of the file's memmap (slicing np.memmap costs two Python calls per
slice, ~150k slices for SmolLM2's vocabulary: 3x slower). The memoized functions are pure for a
file that does not change while it is read (a checkpoint never does), so what transformers
returns is unchanged (the converted weights are bit-identical); the caches go when the block ends.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def memoized_gguf_reads() -> Iterator[None]:
    """Within the block, gguf.GGUFReader(path) and gguf.get_tensor_name_map(arch, n) return one
    object per distinct arguments (transformers imports both from gguf at each call)."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    cached_reader: Any = functools.lru_cache(maxsize=4)(_plain_array_reader(reader))
    # Patching gguf's classes is the point here: mypy refuses assignments to a class.
    gguf.GGUFReader = cached_reader  # type: ignore[misc]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=16)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # type: ignore[misc]


def _plain_array_reader(reader: type) -> type:
    """GGUFReader storing its memmap as a plain ndarray view (the same mapped bytes)."""
    import numpy as np

    class PlainArrayReader(reader):  # type: ignore[misc, valid-type]
        @property
        def data(self) -> Any:
            return self._plain_data

        @data.setter
        def data(self, mapped: Any) -> None:
            self._plain_data = mapped.view(np.ndarray)  # keeps the memmap alive as its base

    return PlainArrayReader
