"""Reading the active document into the chunk store while the user reads, and windows
assembled from it (issue #29), without a model: a fake backend that keeps what it was
asked to read and says a window built from it is cheap."""

from __future__ import annotations

import itertools

from fakes.completion import NO_READ_AHEAD, URI, CachingBackend, ScriptedGeneration, engine_for
from fakes.timing import settled, until
from kode.backends.base import ChunkAssembly, FinishReason, GenerationRequest
from kode.completion.documents import Position
from kode.completion.reading import Reader, regions

# 400 lines of four "tokens" each (the fake counts whitespace-separated words).
DOC = "".join(f"value_{i} = compute ( {i} )\n" for i in range(400))
LINES = set(DOC.splitlines())
RATE = 100.0  # tokens/s: a reading pause prepares 250 tokens, the full window is ~1,000


class AssemblingBackend(CachingBackend):
    """Reads are kept (their lines); a prompt whose every whole line of the document
    was read is assembled for ``assembly`` tokens (40)."""

    def __init__(self, read_steps: int = 0, assembly: int = 40) -> None:
        super().__init__(["x"])
        self.read: set[str] = set()
        self.read_steps = read_steps  # a read's length, in scripted steps of 10 ms
        self.assembly = assembly
        self.reads: list[ScriptedGeneration] = []

    async def generate(self, request: GenerationRequest) -> ScriptedGeneration:
        if request.read_chunks:
            self.read.update(request.prompt.splitlines())
            self.requests.append(request)
            self.reads.append(ScriptedGeneration([""] * self.read_steps, self.delay))
            return self.reads[-1]
        return await super().generate(request)

    def assembled_prefix(self, prompt: str) -> tuple[int, int]:
        total = self.count_tokens(prompt)
        lines = [line for line in prompt.splitlines() if line in LINES]
        if not lines or any(line not in self.read for line in lines):
            return 0, total
        return total - self.assembly, total

    @property
    def chunk_store(self) -> dict[str, int] | None:
        return {"bytes": 0, "tokens": 0, "budgetBytes": 1 << 30}


def test_the_fake_declares_the_chunk_protocol() -> None:
    assert isinstance(AssemblingBackend(), ChunkAssembly)
    assert not isinstance(CachingBackend(["x"]), ChunkAssembly)


def test_regions_end_at_chunk_boundaries_nearest_the_visited_places_first() -> None:
    lines = DOC.splitlines(keepends=True)
    found = regions(lines, near=[390, 10])
    spans = sorted(found)
    assert spans[0][0] == 0 and spans[-1][1] == 400
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(spans))  # no gap
    assert all(b == 400 or b - a >= 96 for a, b in found)
    assert found[0][0] <= 390 < found[0][1]  # the cursor's region first, then line 10's
    assert found[1][0] <= 10 < found[1][1]


def test_an_edited_region_is_read_again_and_no_other() -> None:
    reader = Reader()
    reader.visit(URI, 0)
    read = []
    while (found := reader.next(URI, DOC)) is not None:
        read.append(found[0])
        reader.done(URI, found[1], 10)
    assert sum(len(r.splitlines()) for r in read) == 400
    edited = DOC.replace("value_200 = compute ( 200 )", "value_200 = other ( 200 )")
    again = reader.next(URI, edited)
    assert again is not None and "other" in again[0]
    reader.done(URI, again[1], 10)
    assert reader.next(URI, edited) is None


async def test_the_document_is_read_then_a_jump_prepares_an_assembled_full_window() -> None:
    backend = AssemblingBackend()
    engine = engine_for(
        backend, rate=RATE, defaults=NO_READ_AHEAD, firstAnswerMs=1000, chunkMemoryMb=256
    )
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.preparation.reader.next(URI, DOC) is None)
    await settled(engine)
    reads = [r for r in backend.requests if r.read_chunks]
    assert reads and all(r.background and r.max_tokens == 1 for r in reads)
    assert "value_390 " in reads[0].prompt  # the cursor's region first
    assert sum(len(r.prompt.splitlines()) for r in reads) == 400
    before = len(backend.requests)
    engine.cursor_moved(URI, Position(150, 10))  # a jump of 240 lines
    await until(lambda: engine.preparation.assembled >= 1 or engine.preparation.prepared >= 3)
    prepared = [r for r in backend.requests[before:] if not r.read_chunks]
    assert prepared[0].assemble  # the full window at once, assembled
    assert len(prepared[0].prompt.split()) > 800  # lines 23-160: the whole budget
    await settled(engine)
    await engine.aclose()


async def prepared_after_a_jump(assembly: int) -> list[GenerationRequest]:
    """The document read whole, then a jump of 240 lines into it, assembling its full
    window costing ``assembly`` tokens (the pause: 250, a keystroke's budget: 100): what
    preparation evaluates there, up to the assembled full window."""
    backend = AssemblingBackend(assembly=assembly)
    engine = engine_for(
        backend, rate=RATE, defaults=NO_READ_AHEAD, firstAnswerMs=1000, chunkMemoryMb=256
    )
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.preparation.reader.next(URI, DOC) is None)
    await settled(engine)
    before = len(backend.requests)
    engine.cursor_moved(URI, Position(150, 10))
    await until(lambda: any(r.assemble for r in backend.requests[before:]))
    await settled(engine)
    await engine.aclose()
    return [r for r in backend.requests[before:] if not r.read_chunks]


async def test_an_assembly_longer_than_the_pause_comes_after_a_short_window() -> None:
    # A slow or busy machine: assembling (400 tokens) fits neither the pause (250) nor it
    # and a keystroke's budget (350) but still evaluates far less than the full window
    # (~1,000): first a short window that fits the pause, then the full window
    # assembled, never evaluated whole.
    prepared = await prepared_after_a_jump(assembly=400)
    assert [r.assemble for r in prepared] == [False, True]
    short, full = (len(r.prompt.split()) for r in prepared)
    assert short < 300 < 800 < full


async def test_an_assembly_a_key_at_the_pause_end_would_finish_comes_first() -> None:
    # Assembling (300 tokens) is past the pause (250) but within it and what a keystroke
    # at its end may evaluate (firstAnswerMs: 100 more): no short window before it.
    prepared = await prepared_after_a_jump(assembly=300)
    assert [r.assemble for r in prepared] == [True]


async def test_no_store_no_reading_and_no_assembly() -> None:
    backend = AssemblingBackend()
    engine = engine_for(backend, rate=RATE, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: engine.preparation.prepared >= 2)
    await settled(engine)
    assert not any(r.read_chunks or r.assemble for r in backend.requests)
    await engine.aclose()


async def test_a_cursor_move_stops_the_region_being_read_and_prepares_the_new_place() -> None:
    # Reads that would take 20 s: the move must not wait for one.
    backend = AssemblingBackend(read_steps=2000)
    engine = engine_for(
        backend, rate=RATE, defaults=NO_READ_AHEAD, firstAnswerMs=1000, chunkMemoryMb=256
    )
    engine.documents.open(URI, DOC, 1)
    engine.cursor_moved(URI, Position(390, 10))
    await until(lambda: backend.reads)
    before = len(backend.requests)
    engine.cursor_moved(URI, Position(150, 10))
    await until(lambda: any(not r.read_chunks for r in backend.requests[before:]))
    assert backend.reads[0].stats.finish_reason is FinishReason.CANCELLED
    prepared = next(r for r in backend.requests[before:] if not r.read_chunks)
    assert "value_149 = compute ( 149 )" in prepared.prompt  # the new place's window
    await engine.aclose()
