"""The queue a generation's producer fills and its consumer drains, shared by every backend.

The producer (a worker thread through ``call_soon_threadsafe``, or a task reading an
HTTP stream) puts ``TokenChunk``s, then ``None`` at the end, or an exception to raise
in the consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from kode.backends.base import TokenChunk

ChunkQueue = asyncio.Queue[TokenChunk | BaseException | None]


async def drain(queue: ChunkQueue) -> AsyncGenerator[TokenChunk]:
    """The chunks in ``queue`` up to its ``None``; an exception found there is raised."""
    while True:
        item = await queue.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
