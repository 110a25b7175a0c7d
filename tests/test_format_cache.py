"""router/format_cache.py on the default model's tokenizer: a format compiles once, in a worker
thread while the event loop runs on; requests get independent copies; refusals are kept; the
least recently used format goes first."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from model_runtime.loading import default_model_path
from protos import generation_pb2 as pb
from router.errors import InvalidRequest
from router.format_cache import FormatCache
from router.request import SamplingOptions
from router.tokenizer import Tokenizer

OPTIONS = SamplingOptions(max_new_tokens=8)
SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}})
# 3,000 alternatives: 9 ms to compile on the dev box, long enough for the loop to turn often.
BIG = "(" + "|".join(f"word{i}x{i * 7}" for i in range(3000)) + ")"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def sampling(**spec) -> pb.SamplingParams:
    return pb.SamplingParams(structured_output=pb.StructuredOutput(**spec))


def test_one_format_compiles_once_for_concurrent_and_later_requests(tokenizer) -> None:
    cache = FormatCache(tokenizer)

    async def main() -> None:
        await asyncio.gather(*(cache.warm(sampling(json_schema=SCHEMA).structured_output)
                               for _ in range(5)))  # fmt: skip
        await cache.warm(sampling(json_schema=SCHEMA).structured_output)

    asyncio.run(main())
    assert cache.num_compiled == 1
    first = cache.constraint(sampling(json_schema=SCHEMA), OPTIONS)
    second = cache.constraint(sampling(json_schema=SCHEMA), OPTIONS)
    assert cache.num_compiled == 1 and first is not None and second is not None
    before = second.mask()
    first.advance(tokenizer.encode('{"name": "', add_special_tokens=False))
    assert first.mask() != before and second.mask() == before  # each request its own state


def test_the_loop_runs_while_a_format_compiles(tokenizer) -> None:
    cache = FormatCache(tokenizer)
    cache.constraint(sampling(json_object=True), OPTIONS)  # the vocabulary's view, built once

    async def main() -> int:
        turns = 0
        warming = asyncio.ensure_future(cache.warm(sampling(regex=BIG).structured_output))
        while not warming.done():
            turns += 1
            await asyncio.sleep(0)
        return turns

    turns = asyncio.run(main())
    # Compiled on the loop, the warm would finish within one or two turns.
    assert turns >= 10, turns
    assert cache.num_compiled == 2


def test_a_bad_format_is_refused_from_the_cache(tokenizer) -> None:
    cache = FormatCache(tokenizer)
    bad = sampling(regex="((")
    asyncio.run(cache.warm(bad.structured_output))
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=r"(?s)^structured_output\.regex: .*unclosed"):
            cache.constraint(bad, OPTIONS)
    assert cache.num_compiled == 1


def test_no_format_and_ignore_eos(tokenizer) -> None:
    cache = FormatCache(tokenizer)
    asyncio.run(cache.warm(pb.StructuredOutput()))
    assert cache.constraint(pb.SamplingParams(), OPTIONS) is None and cache.num_compiled == 0
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        cache.constraint(sampling(json_object=True), replace(OPTIONS, ignore_eos=True))
    assert cache.num_compiled == 0  # refused before compiling


def test_the_least_recently_used_format_goes_first(tokenizer) -> None:
    cache = FormatCache(tokenizer, capacity=2)
    for regex in ("a+", "b+", "a+", "c+"):  # "b+" is the least recently used when "c+" comes
        cache.constraint(sampling(regex=regex), OPTIONS)
    assert cache.num_compiled == 3
    cache.constraint(sampling(regex="a+"), OPTIONS)
    assert cache.num_compiled == 3
    cache.constraint(sampling(regex="b+"), OPTIONS)
    assert cache.num_compiled == 4
