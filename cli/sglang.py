"""``kode sglang-command``: the SGLang launch lines for a speculative completion server.

    kode sglang-command --target Qwen/Qwen2.5-Coder-7B --draft Qwen/Qwen2.5-Coder-0.5B \\
        --algorithm STANDALONE --num-steps 3 --topk 1 --num-draft-tokens 4

prints ``python -m sglang.launch_server ...``; with ``--dp N`` it prints one worker
line per GPU and the ``sglang_router`` line that spreads requests over them
(``cache_aware``: requests sharing a prompt prefix go to the same worker, which
suits completion traffic). ``--run`` runs the printed commands on this machine,
which needs SGLang installed (``pip install 'kode[sglang]'`` on a GPU host).

The three tuning flags go together or not at all; NGRAM drafts from the context,
so it takes no draft model and only ``--num-draft-tokens``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kode.backends.errors import CommandError
from kode.serve.sglang_router import router_argv

ALGORITHMS = ("EAGLE3", "EAGLE", "STANDALONE", "NGRAM")


@dataclass(frozen=True, slots=True)
class Launch:
    """The commands to run, each an argv, with the environment each needs."""

    workers: tuple[tuple[dict[str, str], tuple[str, ...]], ...]
    router: tuple[str, ...] | None

    def lines(self) -> list[str]:
        out = []
        for env, argv in self.workers:
            prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
            out.append(prefix + shlex.join(argv))
        if self.router is not None:
            out.append(shlex.join(self.router))
        return out


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sglang-command",
        help="print (or run) the SGLang launch lines for speculative decoding",
        description="Print the exact SGLang server (and router) command lines.",
    )
    parser.add_argument("--target", required=True, help="target model path or Hugging Face id")
    parser.add_argument("--draft", help="draft model (EAGLE head or small model; not for NGRAM)")
    parser.add_argument("--algorithm", required=True, type=str.upper, choices=ALGORITHMS)
    parser.add_argument("--num-steps", type=int, help="--speculative-num-steps (e.g. 3)")
    parser.add_argument("--topk", type=int, help="--speculative-eagle-topk (e.g. 1)")
    parser.add_argument(
        "--num-draft-tokens", type=int, help="--speculative-num-draft-tokens (e.g. 4)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the server listens on")
    parser.add_argument(
        "--port", type=int, default=30000, help="the port clients use (the router's, with --dp)"
    )
    parser.add_argument("--dp", type=int, default=1, help="data-parallel workers (one per GPU)")
    parser.add_argument(
        "--worker-urls",
        nargs="+",
        metavar="URL",
        help="where the --dp workers listen (default: this host, ports after --port)",
    )
    parser.add_argument("--run", action="store_true", help="run the commands here")
    parser.set_defaults(func=run)


def build(args: argparse.Namespace, python: str = "python") -> Launch:
    """The launch for ``args``; raises ``CommandError`` for a bad combination."""
    algorithm: str = args.algorithm
    tuning = {
        "--speculative-num-steps": args.num_steps,
        "--speculative-eagle-topk": args.topk,
        "--speculative-num-draft-tokens": args.num_draft_tokens,
    }
    for flag, value in tuning.items():
        if value is not None and value < 1:
            raise CommandError(f"{flag} must be at least 1")
    spec: list[str] = ["--speculative-algorithm", algorithm]
    if algorithm == "NGRAM":
        if args.draft:
            raise CommandError("NGRAM drafts from the context: it takes no --draft model")
        if args.num_steps is not None or args.topk is not None:
            raise CommandError("NGRAM takes only --num-draft-tokens of the tuning flags")
        if args.num_draft_tokens is not None:
            spec += ["--speculative-num-draft-tokens", str(args.num_draft_tokens)]
    else:
        if not args.draft:
            raise CommandError(f"{algorithm} needs --draft (the draft model or EAGLE head)")
        spec += ["--speculative-draft-model-path", args.draft]
        given = [value is not None for value in tuning.values()]
        if any(given) and not all(given):
            raise CommandError(
                "set all three tuning flags (--num-steps, --topk, --num-draft-tokens) or none"
            )
        if all(given):
            for flag, value in tuning.items():
                spec += [flag, str(value)]
    server = (python, "-m", "sglang.launch_server", "--model-path", args.target, *spec)

    if args.dp < 1:
        raise CommandError("--dp must be at least 1")
    urls: list[str] = list(args.worker_urls or [])
    if args.dp == 1 and not urls:
        argv = (*server, "--host", args.host, "--port", str(args.port))
        return Launch((({}, argv),), None)
    if not urls:
        urls = [f"http://{_url_host(args.host)}:{args.port + 1 + i}" for i in range(args.dp)]
    if args.worker_urls and args.dp not in (1, len(urls)):
        raise CommandError(f"--dp {args.dp} but {len(urls)} --worker-urls")
    local = all(_is_local(url) for url in urls)
    workers = []
    for i, url in enumerate(urls):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.hostname is None or not parts.port:
            raise CommandError(f"worker URL {url!r} must look like http://HOST:PORT")
        host = parts.hostname if _is_local(url) else "0.0.0.0"
        env = {"CUDA_VISIBLE_DEVICES": str(i)} if local else {}
        workers.append((env, (*server, "--host", host, "--port", str(parts.port))))
    return Launch(tuple(workers), router_argv(python, urls, args.host, args.port))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else ("127.0.0.1" if host == "0.0.0.0" else host)


def _is_local(url: str) -> bool:
    return urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")


def run(args: argparse.Namespace) -> int:
    try:
        launch = build(args)
    except CommandError as exc:
        print(f"kode sglang-command: {exc}", file=sys.stderr)
        return 2
    for line in launch.lines():
        print(line)
    if not args.run:
        return 0
    if importlib.util.find_spec("sglang") is None or (
        launch.router is not None and importlib.util.find_spec("sglang_router") is None
    ):
        print(
            "kode sglang-command: --run needs SGLang on this machine: on a GPU host, "
            "pip install 'kode[sglang]'",
            file=sys.stderr,
        )
        return 1
    launch = build(args, python=sys.executable)
    sys.stdout.flush()
    if launch.router is None and len(launch.workers) == 1:
        _env, argv = launch.workers[0]
        os.execv(argv[0], list(argv))
    return _run_all(launch)


def _run_all(launch: Launch) -> int:
    """Start every worker and the router; stop them all when one exits or on Ctrl-C."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for env, argv in launch.workers:
            procs.append(subprocess.Popen(argv, env={**os.environ, **env}))
        if launch.router is not None:
            procs.append(subprocess.Popen(launch.router))
        while True:
            for proc in procs:
                code = proc.poll()
                if code is not None:
                    return code
            try:
                procs[-1].wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        return 130
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
