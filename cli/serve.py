"""``kode serve``: the team completion server (see ``serve/`` and docs/team-server.md).

    kode serve --host 0.0.0.0 --port 8080 --api-keys keys.txt --model default
    kode serve --api-keys keys.txt --upstream http://gpu1:30000 --upstream http://gpu2:30000
    kode serve --name worker-0 --keepalive-s 0.5 --kv-memory-mb 64   # behind SGLang's router

Without ``--api-keys`` it listens only on a loopback address. Once it listens it
prints ``kode serve: listening on http://HOST:PORT`` on stdout (``--port 0`` picks a
free port; the line tells which).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from kode.backends.defaults import CONTEXT_SIZE
from kode.backends.errors import KodeError
from kode.serve.service import Policy

log = logging.getLogger("kode.serve")

_LOOPBACK_NAMES = ("localhost",)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the team completion server (SGLang and OpenAI HTTP APIs)",
        description="Serve completions over HTTP to a team: SGLang's /generate and "
        "/abort_request, OpenAI's /v1/completions, /health and Prometheus /metrics.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port (0: any free port)")
    parser.add_argument(
        "--api-keys",
        type=Path,
        help="file of 'name:key' lines; required unless listening on loopback only",
    )
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="URL",
        help="an SGLang worker or router to forward to (repeat for several); "
        "without it the local llama.cpp engine serves",
    )
    parser.add_argument("--upstream-api-key", default="", help="bearer key for the upstreams")
    parser.add_argument(
        "--upstream-timeout-ms", type=int, default=30000, help="read timeout towards upstreams"
    )
    parser.add_argument(
        "--policy",
        type=Policy,
        choices=list(Policy),
        default=Policy.LEAST_BUSY,
        help="how to pick an upstream",
    )
    parser.add_argument("--model", default="default", help="default | small | a GGUF path")
    parser.add_argument("--context-size", type=int, default=CONTEXT_SIZE)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all)")
    parser.add_argument(
        "--kv-memory-mb",
        type=int,
        default=0,
        metavar="MB",
        help="host memory for saved prompt states of the local engine, so that several "
        "users' files stay evaluated (0: only the one in the context)",
    )
    parser.add_argument(
        "--keepalive-s",
        type=float,
        default=15.0,
        metavar="S",
        help="an SSE comment this often while a stream has nothing to send; behind "
        "SGLang's router use 0.5: the router notices a client gone only when it writes "
        "to it, and only then drops the request here",
    )
    parser.add_argument(
        "--name",
        default="",
        help="this server's name in X-Kode-Worker and meta_info.kode_worker "
        "(default: HOST:PORT as it listens)",
    )
    parser.add_argument("--max-concurrency-per-key", type=int, default=4, metavar="N")
    parser.add_argument("--max-request-bytes", type=int, default=1 << 20, metavar="N")
    parser.add_argument(
        "--log-requests", action="store_true", help="log prompt texts (off: sizes only)"
    )
    parser.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bounds_problem(args: argparse.Namespace) -> str | None:
    """The same bounds as the editor settings (``threads: 100000`` aborted llama.cpp)."""
    from kode.backends.system import usable_cores

    cores = usable_cores()
    if not 0 <= args.threads <= cores:
        return f"--threads must be 0 (every core) to {cores}, the cores this machine lets it use"
    if not 512 <= args.context_size <= 1 << 17:
        return "--context-size must be 512 to 131072 tokens"
    if not 0.05 <= args.keepalive_s <= 300:
        return "--keepalive-s must be 0.05 to 300 seconds"
    if not 0 <= args.kv_memory_mb <= 65_536:
        return "--kv-memory-mb must be 0 to 65536"
    return None


def run(args: argparse.Namespace) -> int:
    if args.api_keys is None and not is_loopback(args.host):
        print(
            f"kode serve: refusing to listen on {args.host} without --api-keys: anyone who "
            "can reach it could use the model. Pass --api-keys FILE ('name:key' lines) or "
            "listen on 127.0.0.1.",
            file=sys.stderr,
        )
        return 2
    for name in ("max_concurrency_per_key", "max_request_bytes", "upstream_timeout_ms"):
        if getattr(args, name) < 1:
            print(f"kode serve: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    problem = _bounds_problem(args)
    if problem is not None:
        print(f"kode serve: {problem}", file=sys.stderr)
        return 2
    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from kode.serve.app import ServeConfig, build_app
    from kode.serve.auth import KeyRing
    from kode.serve.service import CompletionService, Workers

    keys = KeyRing.load(args.api_keys) if args.api_keys is not None else None
    sock = _bind(args.host, args.port)
    try:
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        workers = Workers(await _backends(args), args.policy, serial=not args.upstream)
        service = CompletionService(workers, max_per_key=args.max_concurrency_per_key)
        app = build_app(
            service,
            ServeConfig(
                keys=keys,
                max_request_bytes=args.max_request_bytes,
                log_requests=args.log_requests,
                keepalive_s=args.keepalive_s,
                name=args.name or f"{shown}:{port}",
                context_tokens=0 if args.upstream else args.context_size,
            ),
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=3,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():  # noqa: ASYNC110 (uvicorn's flag)
            await asyncio.sleep(0.02)
        if server.started:
            behind = ", ".join(args.upstream) if args.upstream else workers.model_name
            print(f"kode serve: listening on http://{shown}:{port} ({behind})", flush=True)
        await serving
    finally:
        sock.close()
    return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise KodeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


async def _backends(args: argparse.Namespace) -> list[Any]:
    if args.upstream:
        from kode.backends.remote.clients import SGLangBackend

        return [
            SGLangBackend(
                url,
                api_key=args.upstream_api_key,
                timeout_ms=args.upstream_timeout_ms,
            )
            for url in args.upstream
        ]
    from kode.backends import models
    from kode.backends.llama.backend import LlamaBackend

    path = await asyncio.to_thread(models.resolve, args.model)
    log.info("loading %s", path)
    backend = await LlamaBackend.load(
        path,
        n_ctx=args.context_size,
        n_threads=args.threads or None,
        kv_memory_mb=args.kv_memory_mb,
    )
    return [backend]
