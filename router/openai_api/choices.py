"""OpenAI's ``n``: n choices of one prompt, each a request of its own to the scheduler, answered
as one reply. Choice i samples with seed + i where the body gave a seed (reproducible, and not n
copies of one draw), else with a seed of its own. A whole reply lists the choices by index and
counts the prompt once (router/openai_api/responses.py ``usage``); a stream interleaves the
choices' chunks as they come, each naming its index, then the usage chunk and [DONE]. A choice
that fails ends the reply with its error; a client that goes away aborts every choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from protos import generation_pb2 as pb

MAX_CHOICES = 64  # n at most; a completions batch holds as many prompts at most
MAX_REQUESTS = 256  # prompts x n
UINT64 = (1 << 64) - 1


class ChoiceFailed(Exception):
    """A choice's stream ended in an error; ``event`` is its SSE error event."""

    def __init__(self, event: str) -> None:
        super().__init__(event)
        self.event = event


def fan_out(generate: pb.GenerateRequest, n: int) -> list[pb.GenerateRequest]:
    """The n requests of n choices (the first is ``generate`` itself)."""
    requests = [generate]
    for i in range(1, n):
        copy = pb.GenerateRequest()
        copy.CopyFrom(generate)
        if generate.sampling.HasField("seed"):
            copy.sampling.seed = (generate.sampling.seed + i) & UINT64
        requests.append(copy)
    return requests


async def interleaved(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The streams' events as they come; a ChoiceFailed in one is raised here once the events
    before it are out. Closing this closes every stream (their requests are aborted)."""
    queue: asyncio.Queue[str | ChoiceFailed | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[str]) -> None:
        try:
            async for event in stream:
                await queue.put(event)
        except ChoiceFailed as failed:
            await queue.put(failed)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            event = await queue.get()
            if event is None:
                running -= 1
            elif isinstance(event, ChoiceFailed):
                raise event
            else:
                yield event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
