"""``kode engine``: the shared engine process (``backends/daemon``).

kode engine status [--json]   the engines of this user: pid, model, windows, socket, log
kode engine stop              stop them (their windows start a new one when needed)
kode engine run --model PATH  run one in the foreground (windows start it themselves)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from kode.backends.defaults import (
    CHUNK_MEMORY_MB,
    CONTEXT_SIZE,
    ENGINE_IDLE_MINUTES,
    ENGINE_SLOTS,
    KV_MEMORY_MB,
)
from kode.backends.errors import EngineError, KodeError
from kode.backends.system import alive, choose_thread_waiting

log = logging.getLogger("kode.engine")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "engine", help="the shared engine process (status, stop, run)"
    )
    sub = parser.add_subparsers(dest="engine_command", required=True, metavar="ACTION")
    status = sub.add_parser("status", help="show this user's running engines")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_status)
    stop = sub.add_parser("stop", help="stop this user's engines")
    stop.set_defaults(func=_stop)
    run = sub.add_parser("run", help="run an engine (editor windows start it themselves)")
    run.add_argument("--model", type=Path, required=True, help="GGUF file")
    run.add_argument("--draft", type=Path, default=None, help="draft GGUF (speculation draft)")
    run.add_argument("--n-ctx", type=int, default=CONTEXT_SIZE)
    run.add_argument("--threads", type=int, default=0, help="0: the measured default")
    run.add_argument("--kv-memory-mb", type=int, default=KV_MEMORY_MB)
    run.add_argument("--chunk-memory-mb", type=int, default=CHUNK_MEMORY_MB)
    run.add_argument("--idle-seconds", type=float, default=ENGINE_IDLE_MINUTES * 60.0)
    run.set_defaults(func=_run)


# How long a starting engine tries for its lock: a window looking whether it is held
# holds it for a moment (``lock_is_held``); a running engine holds it for good.
ENGINE_LOCK_WAIT_S = 0.5


def _run(args: argparse.Namespace) -> int:
    # libgomp reads its settings once, when llama.cpp's library loads: before the import
    # (``main`` chose them already; ``_run`` may also be called on its own).
    choose_thread_waiting()
    from kode.backends.daemon.paths import EngineConfig, EngineLock, place_for
    from kode.backends.daemon.server import EngineServer
    from kode.backends.llama.backend import LlamaBackend

    logging.getLogger("kode").setLevel(logging.INFO)
    config = EngineConfig(
        model=args.model,
        draft=args.draft,
        n_ctx=args.n_ctx,
        threads=args.threads,
        kv_memory_mb=args.kv_memory_mb,
        chunk_memory_mb=args.chunk_memory_mb,
    )
    place = place_for(config)
    lock = EngineLock(place.lock)
    if not lock.acquire(wait_s=ENGINE_LOCK_WAIT_S):
        log.info("another engine holds %s; leaving it the work", place.lock)
        return 0
    try:

        async def load() -> LlamaBackend:
            return await LlamaBackend.load(
                config.model,
                n_ctx=config.n_ctx,
                n_slots=ENGINE_SLOTS,
                n_threads=config.threads or None,
                draft_path=config.draft,
                kv_memory_mb=config.kv_memory_mb,
                chunk_memory_mb=config.chunk_memory_mb,
            )

        async def main() -> int:
            server = EngineServer(place, load, idle_s=args.idle_seconds)
            return await server.run()

        return asyncio.run(main())
    finally:
        lock.release()


async def _engines() -> list[tuple[Any, dict[str, Any]]]:
    """Every engine of this user that answers: (its connection, its status)."""
    from kode.backends.daemon.connection import Connection
    from kode.backends.daemon.paths import runtime_dir

    found = []
    for path in sorted(runtime_dir().glob("kode-*.sock")):
        try:
            conn = await Connection.open(
                str(path), fingerprint=path.stem, window=False, timeout_s=5.0
            )
        except (OSError, EngineError) as exc:
            log.info("%s does not answer: %s", path, exc)
            continue
        try:
            found.append((conn, await conn.status(5.0)))
        except (EngineError, TimeoutError):
            await conn.close()
    return found


def _status(args: argparse.Namespace) -> int:
    async def main() -> list[dict[str, Any]]:
        engines = await _engines()
        for conn, _info in engines:
            await conn.close()
        return [info for _conn, info in engines]

    infos = asyncio.run(main())
    if args.json:
        print(json.dumps(infos, indent=2))
        return 0
    if not infos:
        print("no Kode engine is running")
    for info in infos:
        print(
            f"engine pid {info['pid']}: {info['model']}, {info['windows']} window(s), "
            f"up {info['uptimeS']:.0f} s, {info['served']} generations served\n"
            f"  socket {info['socket']}\n  log    {info['log']}"
        )
    return 0


def _stop(args: argparse.Namespace) -> int:
    async def main() -> list[int]:
        pids = []
        for conn, info in await _engines():
            conn.stop_engine()
            await asyncio.sleep(0.05)
            await conn.close()
            pids.append(int(info["pid"]))
        return pids

    pids = asyncio.run(main())
    if not pids:
        print("no Kode engine is running")
        return 0
    deadline = time.monotonic() + 15.0
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            raise KodeError(f"the engine pid {pid} did not stop within 15 s")
        print(f"stopped engine pid {pid}")
    return 0
