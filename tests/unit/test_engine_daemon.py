"""The shared engine's pure parts (issue #15): the private folder and names, the lock,
the framed protocol (versions, every field of a request carried whole), and the
scheduler's rules (hypothesis). No model, no engine process."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.base import (
    FinishReason,
    GenerationRequest,
    GenerationStats,
    Sampling,
    SpeculationMethod,
    SpeculationStats,
)
from kode.backends.daemon import protocol as wire
from kode.backends.daemon.engine_backend import KvMirror
from kode.backends.daemon.launch import end_process
from kode.backends.daemon.paths import (
    EngineConfig,
    EngineLock,
    engine_place,
    lock_is_held,
    runtime_dir,
    verify_private,
)
from kode.backends.daemon.scheduler import EngineJob, Plan, Scheduler
from kode.backends.errors import ContextOverflow, EngineError, EngineSetupError
from kode.backends.monitor import Names

# -- the folder ------------------------------------------------------------------------------


def test_runtime_dir_is_created_private(tmp_path: Path) -> None:
    folder = runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert folder == tmp_path / "kode"
    assert (folder.stat().st_mode & 0o777) == 0o700


def test_runtime_dir_open_to_others_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kode").mkdir(mode=0o755)
    os.chmod(tmp_path / "kode", 0o755)
    with pytest.raises(EngineSetupError, match=r"mode is 0755.*chmod 700"):
        runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)})


def test_runtime_dir_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "kode").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EngineSetupError, match="not a plain folder"):
        runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)})


@pytest.mark.skipif(os.getuid() != 0, reason="changing a folder's owner needs root")
def test_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "kode"
    folder.mkdir(mode=0o700)
    os.chown(folder, 12345, 12345)
    with pytest.raises(EngineSetupError, match="belongs to user id 12345"):
        verify_private(folder)


def test_temp_fallback_without_runtime_dir() -> None:
    folder = runtime_dir({})
    assert folder.name == f"kode-{os.getuid()}"
    assert (folder.stat().st_mode & 0o777) == 0o700


def test_names_carry_version_and_model(tmp_path: Path) -> None:
    a = tmp_path / "a.gguf"
    b = tmp_path / "b.gguf"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    key_a, key_b = EngineConfig(a).key(), EngineConfig(b).key()
    assert key_a != key_b
    assert EngineConfig(a, n_ctx=2048).key() != key_a
    assert EngineConfig(a).key() == key_a
    place = engine_place(key_a, tmp_path, tmp_path)
    assert key_a in place.socket.name
    assert place.socket.suffix == ".sock"


def test_socket_path_too_long_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 100)
    with pytest.raises(EngineSetupError, match="longer than Unix sockets allow"):
        engine_place("abc", deep, tmp_path)


def test_a_starting_engine_gets_its_lock_past_a_windows_look(tmp_path: Path) -> None:
    """A window's ``lock_is_held`` takes the lock for a moment; an engine starting in
    that moment must not conclude another engine runs (it exited, and its window, which
    spawns once, fell back to its own model)."""
    path = tmp_path / "e.lock"
    look = EngineLock(path)
    assert look.acquire(write_pid=False)  # the window looking
    assert not EngineLock(path).acquire()  # no wait: taken for another engine
    engine = EngineLock(path)
    got: list[bool] = []
    trying = threading.Thread(target=lambda: got.append(engine.acquire(wait_s=30)))
    trying.start()
    look.release()  # the look ends
    trying.join(30)
    assert got == [True] and lock_is_held(path)
    engine.release()


# -- the protocol --------------------------------------------------------------------------


def test_a_request_is_carried_whole() -> None:
    request = GenerationRequest(
        prompt="<|fim_prefix|>def f():\n<|fim_suffix|>\n<|fim_middle|>",
        max_tokens=17,
        sampling=Sampling(temperature=0.5, top_p=0.9, seed=7),
        speculation=SpeculationMethod.NGRAM,
        draft_sources=("suffix", "other file"),
        moved_kv_drift=32,
        background=True,
        document="file:///a.py",
        names=Names(
            "x = os.",
            {"os": ("getcwd", "sep"), "self": ("x",)},
            ("self",),
            {"self": {"y": 0.5}},
        ),
    )
    frame = wire.encode(wire.Generate(id=3, request=request))
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    back = wire.decode_window(frame[4:])
    assert isinstance(back, wire.Generate)
    # every field, present and future, comes back equal
    assert dataclasses.replace(back.request, draft_sources=tuple(back.request.draft_sources)) == (
        request
    )
    assert back.request.speculation is SpeculationMethod.NGRAM
    assert back.request.names == request.names  # the names monitor's receivers


def test_stats_come_back_whole() -> None:
    stats = GenerationStats(
        prompt_tokens=100,
        reused_prompt_tokens=90,
        completion_tokens=5,
        finish_reason=FinishReason.CANCELLED,
        speculation=SpeculationStats(method=SpeculationMethod.NGRAM, steps=3, accepted=2),
    )
    frame = wire.encode(wire.End(id=1, stats=stats, kv_memory={"states": 2}, decode_calls=9))
    back = wire.decode_engine(frame[4:])
    assert isinstance(back, wire.End)
    assert back.stats == stats and back.kv_memory == {"states": 2} and back.decode_calls == 9


def hello(protocol: int) -> bytes:
    return msgspec.msgpack.encode(
        {
            "type": "hello",
            "protocol": protocol,
            "kode_version": "9.9",
            "fingerprint": "x",
            "pid": 1,
            "future_field": [1, 2],
        }
    )


def test_a_window_of_another_protocol_is_told_why() -> None:
    with pytest.raises(EngineSetupError, match=r"window speaks engine protocol 99 \(Kode 9.9\)"):
        wire.decode_hello(hello(99))
    assert wire.decode_hello(hello(wire.PROTOCOL_VERSION)).pid == 1


def test_an_engine_of_another_protocol_is_told_why() -> None:
    other = wire.Welcome(protocol=99, kode_version="9.9", pid=5, socket="s", engine="e", model="m")
    with pytest.raises(EngineSetupError, match="engine speaks engine protocol 99"):
        wire.check_welcome(other)
    with pytest.raises(EngineSetupError, match="refused this window: no model"):
        wire.check_welcome(wire.Refused(message="no model"))


def test_errors_keep_their_kind() -> None:
    failed = wire.failure(4, ContextOverflow("too long"))
    back = wire.decode_engine(wire.encode(failed)[4:])
    assert isinstance(back, wire.Failed)
    err = wire.raised(back)
    assert isinstance(err, ContextOverflow) and str(err) == "too long"
    # anything not Kode's own is named by its type only (its text may quote code)
    assert wire.failure(1, UnicodeError("def secret():")).message == "UnicodeError"


def test_garbage_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="malformed"):
        wire.decode_window(b"\xc1\xc1")


async def read_all(data: bytes) -> list[bytes | None]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out: list[bytes | None] = []
    while True:
        try:
            frame = await wire.read_frame(reader)
        except EngineError as exc:
            out.append(str(exc).encode())
            return out
        out.append(frame)
        if frame is None:
            return out


async def test_frames_cut_short_or_too_large() -> None:
    one = wire.encode(wire.Cancel(id=1))
    assert (await read_all(one + one)) == [one[4:], one[4:], None]
    cut = await read_all(one + one[:6])
    assert cut[-1] == b"the connection ended inside a frame"
    huge = (wire.MAX_FRAME + 1).to_bytes(4, "big")
    assert b"larger than" in (await read_all(huge))[-1]  # type: ignore[operator]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**31), max_size=20), st.data())
def test_frames_survive_any_split(ids: list[int], data: st.DataObject) -> None:
    stream = b"".join(wire.encode(wire.Cancel(id=i)) for i in ids)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))

    async def run() -> list[int]:
        reader = asyncio.StreamReader()
        last = 0
        for cut in [*cuts, len(stream)]:
            reader.feed_data(stream[last:cut])
            last = cut
        reader.feed_eof()
        got = []
        while (frame := await wire.read_frame(reader)) is not None:
            message = wire.decode_window(frame)
            assert isinstance(message, wire.Cancel)
            got.append(message.id)
        return got

    assert asyncio.run(run()) == ids


# -- the window's estimate of the engine's cache -----------------------------------------------


def test_mirror_reach() -> None:
    mirror = KvMirror(size=2)
    mirror.remember([1, 2, 3, 4], evaluated=4)
    mirror.remember([7, 8, 9], evaluated=2)  # cancelled after two tokens
    assert mirror.reach([7, 8, 9, 10]) == 2
    assert mirror.reach([1, 2, 3, 4, 5]) == 4
    mirror.remember([5, 5, 5], evaluated=3)  # the oldest is forgotten
    assert mirror.reach([1, 2, 3, 4, 5]) == 0
    assert mirror.reach([5, 5, 5]) == 2  # the last token is always evaluated


# -- the scheduler ----------------------------------------------------------------------------


def started(plan: Plan) -> list[int]:
    return [job.id for job in plan.start]


def test_keystroke_pauses_background_work_which_resumes_when_quiet() -> None:
    s = Scheduler(quiet_s=0.25)
    read_ahead = EngineJob(1, window=1, background=True, document="a")
    assert started(s.submit(read_ahead, now=0.0)) == [1]
    key = EngineJob(2, window=2, background=False, document="b")
    plan = s.submit(key, now=1.0)
    assert plan.pause is read_ahead and plan.start == ()
    assert started(s.finished(1, paused=True, now=1.01)) == [2]
    plan = s.finished(2, now=1.4)
    assert plan.start == () and plan.wake_at == pytest.approx(1.65)
    key2 = EngineJob(3, window=1, background=False, document="a2")
    assert started(s.submit(key2, now=1.5)) == [3]  # typing goes on: it waits more
    assert s.finished(3, now=1.6).wake_at == pytest.approx(1.85)
    assert s.poke(now=1.7).start == ()
    assert started(s.poke(now=1.85)) == [1]


def test_newest_keystroke_first_and_no_foreground_interrupted() -> None:
    s = Scheduler()
    first = EngineJob(1, window=1, background=False, document="a")
    s.submit(first, now=0.0)
    older = EngineJob(2, window=2, background=False, document="b")
    newer = EngineJob(3, window=3, background=False, document="c")
    assert s.submit(older, now=0.1) == Plan()
    assert s.submit(newer, now=0.2) == Plan()  # the running keystroke is not interrupted
    assert started(s.finished(1, now=0.3)) == [3]
    assert started(s.finished(3, now=0.4)) == [2]


def test_keystrokes_of_two_windows_run_together_up_to_the_width() -> None:
    s = Scheduler(width=2)
    assert started(s.submit(EngineJob(1, window=1, background=False, document="a"), now=0.0)) == [1]
    assert started(s.submit(EngineJob(2, window=2, background=False, document="b"), now=0.1)) == [2]
    third = EngineJob(3, window=3, background=False, document="c")
    assert s.submit(third, now=0.2) == Plan()  # no room: the newest waits first in line
    fourth = EngineJob(4, window=3, background=False, document="d")
    s.submit(fourth, now=0.3)
    assert started(s.finished(2, now=0.4)) == [4]
    # a keystroke replacing a running one of its document: both hold a place meanwhile
    plan = s.submit(EngineJob(5, window=1, background=False, document="a"), now=0.5)
    assert [j.id for j in plan.stop] == [1] and plan.start == ()
    assert started(s.finished(1, now=0.6)) == [5]
    assert [j.id for j in s.running] == [4, 5] and s.waiting == [third]


def test_background_work_runs_alone_and_yields_to_any_keystroke() -> None:
    s = Scheduler(width=2, quiet_s=0.25)
    bg = EngineJob(1, window=1, background=True, document="big")
    assert started(s.submit(bg, now=0.0)) == [1]
    other_bg = EngineJob(2, window=2, background=True, document="other")
    assert s.submit(other_bg, now=0.1) == Plan()  # background work never runs beside another
    key_a = EngineJob(3, window=3, background=False, document="a")
    key_b = EngineJob(4, window=4, background=False, document="b")
    assert s.submit(key_a, now=1.0).pause is bg
    assert s.submit(key_b, now=1.0) == Plan()  # bg is stopping: nothing beside it
    assert started(s.finished(1, paused=True, now=1.05)) == [4, 3]
    assert s.finished(4, now=1.2) == Plan()  # a keystroke runs: background waits
    assert s.finished(3, now=1.3).wake_at == pytest.approx(1.55)
    assert started(s.poke(now=1.55)) == [2]  # the newest background work first


def test_latest_wins_per_document() -> None:
    s = Scheduler()
    s.submit(EngineJob(1, window=1, background=False, document="x"), now=0)
    queued = EngineJob(2, window=2, background=False, document="a")
    s.submit(queued, now=0)
    plan = s.submit(EngineJob(3, window=2, background=False, document="a"), now=0)
    assert plan.stop == (queued,)
    plan = s.submit(EngineJob(4, window=1, background=False, document="x"), now=0)
    assert [j.id for j in plan.stop] == [1]  # the running one of the same document stops
    assert s.finished(1, now=0).start != ()


def test_a_replacing_request_starts_in_the_slot_the_replaced_one_leaves() -> None:
    """Room for two, yet a document's next keystroke waits for its previous generation
    to stop (that one's slot holds the document's prompt); another window's does not."""
    s = Scheduler(width=2)
    s.submit(EngineJob(1, window=1, background=False, document="x"), now=0)
    plan = s.submit(EngineJob(2, window=1, background=False, document="x"), now=0.1)
    assert [j.id for j in plan.stop] == [1] and plan.start == ()
    assert [
        j.id
        for j in s.submit(EngineJob(3, window=2, background=False, document="x"), now=0.1).start
    ] == [3]
    assert [j.id for j in s.finished(1, now=0.15).start] == [2]


def test_disconnect_drops_everything_of_the_window() -> None:
    s = Scheduler(width=2)
    running = EngineJob(1, window=1, background=False, document="a")
    s.submit(running, now=0)
    neighbour = EngineJob(4, window=2, background=False, document="n")
    s.submit(neighbour, now=0)
    waiting = EngineJob(2, window=1, background=True, document="b")
    other = EngineJob(3, window=2, background=True, document="c")
    s.submit(waiting, now=0)
    s.submit(other, now=0)
    plan = s.disconnect(1, now=0)
    assert set(plan.stop) == {running, waiting} and neighbour not in plan.stop
    assert s.finished(1, now=10) == Plan()  # the neighbour's keystroke still runs
    assert s.finished(4, now=10).wake_at == 10.25  # a keystroke just ended: quiet first
    assert started(s.poke(now=10.25)) == [3]


def test_a_paused_job_of_a_gone_window_is_not_resumed() -> None:
    s = Scheduler()
    bg = EngineJob(1, window=1, background=True)
    s.submit(bg, now=0)
    s.submit(EngineJob(2, window=2, background=False), now=0)
    s.disconnect(1, now=0)
    assert s.finished(1, paused=True, now=0).start != ()
    assert bg not in s.waiting


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 3), st.booleans(), st.sampled_from("ab")),
        st.tuples(st.just("finish"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("disconnect"), st.integers(1, 3)),
        st.tuples(st.just("cancel"), st.integers(1, 30)),
        st.tuples(st.just("wait"), st.floats(0.0, 0.5)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(1, 3))
def test_scheduler_rules_hold_for_any_sequence(ops: list[tuple[object, ...]], width: int) -> None:
    """Whatever happens: at most ``width`` jobs run, and background work only alone; a
    keystroke never waits while there is room for it (fewer than ``width`` run and no
    background work) unless its document's previous generation still stops; background
    work waits only within the quiet time (and then a wake-up is asked for); the started
    jobs are the best waiting ones, in order (keystrokes first, newest first); a keystroke
    never waits behind background work that was not told to pause; a gone window has
    nothing waiting."""
    quiet = 0.25
    s = Scheduler(quiet_s=quiet, width=width)
    ids = iter(range(1, 1000))
    told_to_stop: set[int] = set()
    gone: set[int] = set()
    now = 0.0

    def check(plan: Plan, before: list[EngineJob]) -> None:
        # A job of a document whose previous generation still stops waits for its slot.
        pool = [j for j in before if not s._follows(j)]
        for job in plan.start:
            best = max(pool, key=lambda j: (not j.background, j.seq))
            assert job is best
            pool.remove(job)
            assert not job.background or now >= s.last_foreground + quiet
        if plan.pause is not None:
            told_to_stop.add(plan.pause.id)
        for job in plan.stop:
            told_to_stop.add(job.id)
        running = s.running
        assert len(running) <= width
        assert not any(j.background for j in running) or len(running) == 1
        background = any(j.background for j in running)
        if any(not j.background and not s._follows(j) for j in s.waiting):
            assert background or len(running) == width
        if not running and s.waiting:
            assert all(j.background for j in s.waiting)
            assert plan.wake_at == pytest.approx(s.last_foreground + quiet)
            assert plan.wake_at > now
        for job in running:
            if job.background and job.id not in told_to_stop:
                assert all(j.background for j in s.waiting)
        assert not any(j.window in gone for j in s.waiting)

    for op in ops:
        if op[0] == "submit":
            _, window, background, document = op
            assert isinstance(window, int) and isinstance(background, bool)
            gone.discard(window)
            job = EngineJob(next(ids), window=window, background=background, document=str(document))
            kept = [
                j
                for j in s.waiting
                if (j.window, j.document) != (window, document) or (background and not j.background)
            ]
            check(s.submit(job, now=now), [*kept, job])
        elif op[0] == "finish" and s.running:
            _, which, want_pause = op
            assert isinstance(which, int)
            running = s.running[which % len(s.running)]
            paused = bool(want_pause) and running.id in told_to_stop and running.background
            before = list(s.waiting) + ([running] if paused and not running.abandoned else [])
            plan = s.finished(running.id, paused=paused, now=now)
            told_to_stop.discard(running.id)
            check(plan, before)
        elif op[0] == "disconnect":
            window = op[1]
            assert isinstance(window, int)
            gone.add(window)
            before = [j for j in s.waiting if j.window != window]
            check(s.disconnect(window, now=now), before)
        elif op[0] == "cancel":
            job_id = op[1]
            before = [j for j in s.waiting if j.id != job_id]
            check(s.cancel(int(str(job_id)), now=now), before)
        elif op[0] == "wait":
            now += float(str(op[1]))
            before = list(s.waiting)
            check(s.poke(now=now), before)


# -- the settings -----------------------------------------------------------------------------


def test_engine_settings_are_validated() -> None:
    from kode.completion.settings import EngineMode, parse

    settings, problems = parse({"engine": "daemon", "engineIdleMinutes": -1})
    assert settings.engine is EngineMode.SHARED and settings.engine_idle_minutes == 30
    assert problems[0] == "engine: 'daemon' is not one of shared, inProcess; using the default"
    assert problems[1].startswith("engineIdleMinutes: Expected `int` >= 0")
    settings, problems = parse({"engine": "shared", "engineIdleMinutes": 0})
    assert (settings.engine, settings.engine_idle_minutes, problems) == (
        EngineMode.SHARED,
        0,
        [],
    )


def test_end_process_never_signals_this_process() -> None:
    end_process(os.getpid())
    end_process(1)
