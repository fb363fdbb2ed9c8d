"""Load test for ``kode serve``: simulated users typing into their own documents.

    kode bench load --users 20 --seconds 30 --spawn-server --model small
    kode bench load --users 20 --seconds 30 --url http://127.0.0.1:8080 --keys-file keys.txt
    kode bench load --through-router --users 8 --seconds 20

``--through-router`` starts the team deployment of docs/team-server.md here
(``bench/router_chain.py``: ``kode serve`` with keys -> SGLang's router, cache_aware ->
two ``kode serve`` workers with the small model) and adds, per worker, its share of the
requests, the users whose first request went there, and its own counters (aborted
tokens, nothing left running), and the affinity: the share of each user's requests that
ran on the worker their first one ran on (``meta_info.kode_worker`` says which). Two
workers with one thread each on a 2-core machine show whether the router keeps a
user's keystrokes where their prefix is cached and spreads users over both, and that an
abort reaches the worker; not throughput, which needs GPU workers.

Each user types into a source file of this repository: bursts of keystrokes 50-200 ms
apart, then a pause of 0.5-2 s. Every keystroke sends a new streaming ``/generate``
request for the same document (a FIM prompt around the cursor whose prefix starts at a
fixed place, as an editor's window does while the user types on), so the server's
latest-wins rule aborts the previous one. Every user has an API key of their own
(``--spawn-server`` writes them; otherwise ``--keys-file``, or one ``--api-key``).

Bounded: users stop sending after ``--seconds`` and every request has a timeout.
Afterwards the report gives p50/p95 latency (request to last event, completed
requests only) and time to first text, counts of completed / aborted / failed
requests, the server's abort counters, and checks from ``/metrics`` that no
generation is left running once the clients have gone (exit status 1 if any is).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kode.backends.remote.sse import SSEDecoder
from kode.bench import harness
from kode.bench.report import percentile
from kode.bench.tasks import REPO_ROOT as ROOT
from kode.completion.templates import QWEN25_CODER, render
from kode.serve.metrics import parse_text

SOURCES = ("backends", "completion", "serve", "lsp", "cli")


@dataclass
class Tally:
    """What the simulated users saw."""

    sent: int = 0
    completed: int = 0
    aborted: int = 0
    failed: int = 0
    busy: int = 0  # 429
    latencies: list[float] = field(default_factory=list)  # completed requests, seconds
    ttfts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    routes: dict[int, list[str]] = field(default_factory=dict)  # user -> workers, in order


def documents(count: int) -> list[tuple[str, str]]:
    """``count`` (uri, text) pairs from this repository's sources (reused if too few)."""
    files = sorted(p for d in SOURCES for p in (ROOT / d).glob("*.py") if p.stat().st_size > 2000)
    if not files:
        raise SystemExit("bench.load: no source files to type into")
    return [
        (files[i % len(files)].as_uri() + f"#user{i}", files[i % len(files)].read_text())
        for i in range(count)
    ]


def prompt_at(text: str, cursor: int, anchor: int) -> str:
    """The FIM prompt with the prefix from ``anchor`` (fixed while the user types on)."""
    return render(QWEN25_CODER, text[anchor:cursor], text[cursor : cursor + 300])


async def one_request(
    client: httpx.AsyncClient,
    key: str,
    document: str,
    prompt: str,
    max_tokens: int,
    tally: Tally,
    timeout_s: float,
    route: list[str] | None = None,
) -> None:
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0},
        "stream": True,
        "document": document,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    first: float | None = None
    worker = ""
    tally.sent += 1
    if route is not None:
        slot = len(route)
        route.append("")  # filled in once the answer names its worker
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", "/generate", json=body, headers=headers) as resp:
                if resp.status_code == 429:
                    tally.busy += 1
                    return
                if resp.status_code != 200:
                    tally.failed += 1
                    tally.errors.append(f"HTTP {resp.status_code}")
                    return
                decoder = SSEDecoder()
                finish: dict[str, Any] | None = None
                async for raw in resp.aiter_bytes():
                    for event in decoder.feed(raw):
                        if event.done:
                            break
                        data = json.loads(event.data)
                        if "error" in data:
                            raise RuntimeError(str(data["error"])[:200])
                        if first is None and data.get("text"):
                            first = time.perf_counter()
                        meta = data["meta_info"]
                        finish = meta["finish_reason"] or finish
                        worker = meta.get("kode_worker") or worker
    except (httpx.HTTPError, RuntimeError, TimeoutError) as exc:
        tally.failed += 1
        tally.errors.append(f"{type(exc).__name__}: {exc}"[:200])
        return
    finally:
        if route is not None:
            route[slot] = worker
    if finish is not None and finish.get("type") == "abort":
        tally.aborted += 1
        return
    end = time.perf_counter()
    tally.completed += 1
    tally.latencies.append(end - start)
    if first is not None:
        tally.ttfts.append(first - start)


async def user(
    client: httpx.AsyncClient,
    key: str,
    document: tuple[str, str],
    seed: int,
    deadline: float,
    args: argparse.Namespace,
    tally: Tally,
) -> None:
    uri, text = document
    rng = random.Random(seed)
    cursor = rng.randrange(len(text) // 4, len(text) // 2)
    anchor = max(0, cursor - 1500)
    route = tally.routes.setdefault(seed, [])
    pending: set[asyncio.Task[None]] = set()
    while time.monotonic() < deadline:
        for _ in range(rng.randint(2, 8)):
            if time.monotonic() >= deadline:
                break
            cursor = min(cursor + 1, len(text))
            task = asyncio.create_task(
                one_request(
                    client,
                    key,
                    uri,
                    prompt_at(text, cursor, anchor),
                    args.max_tokens,
                    tally,
                    args.request_timeout,
                    route,
                )
            )
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(rng.uniform(0.05, 0.2))
        await asyncio.sleep(rng.uniform(0.5, 2.0))
    if pending:
        await asyncio.wait(pending)


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    response = await client.get("/metrics")
    response.raise_for_status()
    return parse_text(response.text)


async def settle(client: httpx.AsyncClient, timeout_s: float = 15.0) -> dict[str, float]:
    """Metrics once nothing runs any more (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await scrape(client)
        idle = not samples.get("kode_generations_active") and not samples.get("kode_jobs_in_flight")
        if idle or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.2)


def routing(routes: dict[int, list[str]]) -> dict[str, Any]:
    """Where each user's requests ran (``""``: no answer named a worker; left out).

    ``affinity``: of all the requests, the share that ran on the worker their user's
    first request ran on; ``lowestUserAffinity``: the same for the user it is lowest for;
    ``users``: how many users' first request each worker took; ``requests``: how many
    requests each worker ran. User 0 moved once, user 1 never::

        >>> routing({0: ["a", "a", "", "b"], 1: ["b", "b"]})
        {'affinity': 0.8, 'lowestUserAffinity': 0.667, 'users': {'a': 1, 'b': 1}, \
'requests': {'a': 2, 'b': 3}}
    """
    stay = total = 0
    lowest = 1.0
    users: dict[str, int] = {}
    requests: dict[str, int] = {}
    for route in routes.values():
        known = [worker for worker in route if worker]
        if not known:
            continue
        users[known[0]] = users.get(known[0], 0) + 1
        for worker in known:
            requests[worker] = requests.get(worker, 0) + 1
        on_first = known.count(known[0])
        stay += on_first
        total += len(known)
        lowest = min(lowest, on_first / len(known))
    return {
        "affinity": round(stay / total, 3) if total else float("nan"),
        "lowestUserAffinity": round(lowest, 3) if total else float("nan"),
        "users": dict(sorted(users.items())),
        "requests": dict(sorted(requests.items())),
    }


def _pct(values: list[float], q: float) -> float:
    got = percentile(values, q)
    return float("nan") if got is None else got


def _left(samples: dict[str, float]) -> float:
    return samples.get("kode_generations_active", 0.0) + samples.get("kode_jobs_in_flight", 0.0)


async def run_load(
    url: str,
    keys: list[str],
    args: argparse.Namespace,
    workers: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Run the load and return the report (``leftRunning`` must be 0). ``workers``:
    (name, URL) of the servers behind a router, whose own counters are reported too."""
    tally = Tally()
    docs = documents(args.users)
    limits = httpx.Limits(max_connections=args.users * 8, max_keepalive_connections=args.users)
    timeout = httpx.Timeout(args.request_timeout)
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout)
        )
        peers = {
            name: await stack.enter_async_context(httpx.AsyncClient(base_url=peer, timeout=10))
            for name, peer in workers
        }
        before = await scrape(client)
        before_peers = {name: await scrape(peer) for name, peer in peers.items()}
        started = time.monotonic()
        deadline = started + args.seconds
        users = [
            user(client, keys[i % len(keys)] if keys else "", docs[i], i, deadline, args, tally)
            for i in range(args.users)
        ]
        await asyncio.gather(*users)
        elapsed = time.monotonic() - started
        after = await settle(client)
        after_peers = {name: await settle(peer) for name, peer in peers.items()}

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    left = _left(after)
    report: dict[str, Any] = {
        "users": args.users,
        "seconds": round(elapsed, 1),
        "requests": tally.sent,
        "completed": tally.completed,
        "abortedSeenByClients": tally.aborted,
        "failed": tally.failed,
        "busy429": tally.busy,
        "latencyP50Ms": round(_pct(tally.latencies, 50) * 1000, 1),
        "latencyP95Ms": round(_pct(tally.latencies, 95) * 1000, 1),
        "ttftP50Ms": round(_pct(tally.ttfts, 50) * 1000, 1),
        "ttftP95Ms": round(_pct(tally.ttfts, 95) * 1000, 1),
        "server": {
            "generationsStarted": delta("kode_generations_started_total"),
            "abortedSuperseded": delta('kode_generations_aborted_total{cause="superseded"}'),
            "abortedDisconnect": delta('kode_generations_aborted_total{cause="disconnect"}'),
            "completionTokens": delta("kode_completion_tokens_total"),
            "stepsAfterCancel": delta('kode_backend_steps_after_cancel_total{worker="0"}'),
        },
        "leftRunning": left,
        "errors": sorted(set(tally.errors))[:5],
    }
    if workers:
        report["router"] = _router_report(tally, before_peers, after_peers)
        report["leftRunning"] = left + sum(_left(samples) for samples in after_peers.values())
    return report


ROUTER_NOTE = (
    "two 1-thread workers on this machine's cores: read affinity, spread and aborts, "
    "not throughput (a GPU worker batches what these queue)"
)


def _router_report(
    tally: Tally, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Affinity and spread from the answers, and each worker's own counters."""
    out = routing(tally.routes)
    per_worker: dict[str, Any] = {}
    for name, samples in after.items():

        def delta(metric: str, name: str = name, samples: dict[str, float] = samples) -> float:
            return samples.get(metric, 0.0) - before[name].get(metric, 0.0)

        per_worker[name] = {
            "generationsStarted": delta("kode_generations_started_total"),
            "abortedDisconnect": delta('kode_generations_aborted_total{cause="disconnect"}'),
            "completionTokens": delta("kode_completion_tokens_total"),
            "abortedTokens": delta("kode_aborted_completion_tokens_total"),
            "leftRunning": _left(samples),
        }
    out["workers"] = per_worker
    out["abortedTokens"] = sum(w["abortedTokens"] for w in per_worker.values())
    out["note"] = ROUTER_NOTE
    return out


def spawn_server(
    args: argparse.Namespace, workdir: Path
) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Start ``kode serve`` on a free loopback port with one key per user."""
    keys = [secrets.token_hex(16) for _ in range(args.users)]
    keyfile = workdir / "keys.txt"
    keyfile.write_text("".join(f"user{i}:{k}\n" for i, k in enumerate(keys)))
    cmd = harness.kode_command(
        "serve", "--host", "127.0.0.1", "--port", "0",
        "--api-keys", str(keyfile), "--model", args.model, "--threads", str(args.threads),
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=harness.die_with_parent,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return proc, match.group(1), keys
    proc.kill()
    proc.wait(timeout=5)
    proc.stdout.close()
    raise SystemExit("bench.load: kode serve did not start")


def run(args: argparse.Namespace) -> int:
    """The load run ``args`` describe (``kode bench load``'s, checked there)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        chain = None
        workers: list[tuple[str, str]] = []
        try:
            if args.through_router:
                from kode.bench.router_chain import start_chain

                chain = start_chain(Path(tmp), users=args.users, threads=args.threads or 1)
                url, keys = chain.front.url, chain.keys
                workers = [(w.name, w.url) for w in chain.workers]
            elif args.spawn_server:
                proc, url, keys = spawn_server(args, Path(tmp))
            else:
                url = args.url
                keys = [args.api_key] if args.api_key else []
                if args.keys_file is not None:
                    keys = [
                        line.split(":", 1)[1].strip()
                        for line in args.keys_file.read_text().splitlines()
                        if ":" in line and not line.lstrip().startswith("#")
                    ]
            report = asyncio.run(run_load(url, keys, args, workers))
        finally:
            if chain is not None:
                chain.stop()
            if proc is not None:
                harness.stop(proc)
                if proc.stdout is not None:
                    proc.stdout.close()
    if args.json:
        print(json.dumps(report))
    else:
        for name, value in report.items():
            print(f"{name:22} {value}")
    return 0 if report["leftRunning"] == 0 else 1
