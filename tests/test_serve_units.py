"""Pieces of ``kode serve`` and the CLI that need no server: keys, metrics, stop strings,
the SGLang command line and the backend factory."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
from pathlib import Path

import pytest
from fakes.serving import FakeLocal
from kode.backends.base import GenerationRequest
from kode.backends.errors import SettingsError
from kode.backends.remote.clients import OpenAIBackend, SGLangBackend
from kode.backends.router import RoutingBackend
from kode.backends.stop_strings import find_stop, held_back
from kode.cli import sglang as sglang_cli
from kode.completion.backend_factory import build_remote, load_backend
from kode.completion.settings import parse
from kode.serve.auth import KeyRing
from kode.serve.metrics import Counter, Histogram, Metrics, parse_text
from kode.serve.service import CompletionService, Job, Policy, Workers
from kode_servers import run_kode

# -- keys -----------------------------------------------------------------------------

KEYS = """
# team keys
alice: alice-key-0123456789abcdef

bob:bob-key-0123456789abcdef01
"""


def test_keys_are_kept_as_digests_and_matched() -> None:
    ring = KeyRing.parse(KEYS)
    assert [name for name, _ in ring.digests] == ["alice", "bob"]
    assert all(len(digest) == 32 for _, digest in ring.digests)
    assert "alice-key" not in repr(ring)
    assert ring.digests[0][1] == hashlib.sha256(b"alice-key-0123456789abcdef").digest()
    assert ring.identify("bob-key-0123456789abcdef01") == "bob"
    assert ring.identify("bob-key-0123456789abcdef0") is None
    assert ring.identify_header("Bearer alice-key-0123456789abcdef") == "alice"
    assert ring.identify_header("bearer  alice-key-0123456789abcdef ") == "alice"
    assert ring.identify_header("Basic alice-key-0123456789abcdef") is None
    assert ring.identify_header(None) is None
    assert ring.identify_header("Bearer ") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice", "line 1: expected 'name:key'"),
        ("alice:short", "fewer than 16"),
        ("a b:0123456789abcdef0", "a name may hold"),
        ("a:0123456789abcdef0\na:0123456789abcdef1", "line 2: the name 'a' appears twice"),
        ("a:0123456789abcdef0\nb:0123456789abcdef0", "also another name's key"),
        ("# nothing\n\n", "no keys"),
    ],
)
def test_bad_keys_files(text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        KeyRing.parse(text)
    assert "0123456789abcdef" not in str(info.value)  # never echo a key


def test_missing_keys_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read the API keys file"):
        KeyRing.load(tmp_path / "nope.txt")


def test_keys_file_encodings_and_permissions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #14: not UTF-8 was a traceback, a BOM a misleading message, a file that
    everyone may read no warning."""
    path = tmp_path / "keys.txt"
    path.write_bytes(b"alice:\xe9t\xe9-key-0123456789abcdef\n")  # Latin-1
    with pytest.raises(SettingsError, match="is not UTF-8 text"):
        KeyRing.load(path)
    path.write_bytes("\ufeffalice:alice-key-0123456789abcdef\n".encode())
    path.chmod(0o600)
    with caplog.at_level("WARNING", logger="kode.serve"):
        assert KeyRing.load(path).identify("alice-key-0123456789abcdef") == "alice"
    assert not caplog.records
    path.chmod(0o644)
    with caplog.at_level("WARNING", logger="kode.serve"):
        KeyRing.load(path)
    assert "can be read by other users (mode 644); run: chmod 600" in caplog.text
    assert "alice-key" not in caplog.text


async def test_stop_strings_and_request_fields_are_bounded() -> None:
    """Issue #14: 70,000 stop strings stalled the event loop for everyone."""

    import httpx
    from kode.serve.app import MAX_STOPS, ServeConfig, build_app

    local = FakeLocal(chunks=["x"])
    service = CompletionService(Workers([local]), max_per_key=4)
    app = build_app(service, ServeConfig())
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://kode") as client:
            many = {"prompt": "p", "max_tokens": 1, "stop": ["\n"] * 70_000}
            reply = await client.post("/v1/completions", json=many)
            assert reply.status_code == 400
            assert f"length <= {MAX_STOPS}" in reply.json()["error"]["message"]
            assert local.requests == []  # refused before any work
            for body in (
                {"prompt": "p", "stop": "x" * 10_000},
                {"prompt": "p", "seed": -1},
                {"prompt": "p", "n": 2},
                {"text": "p", "rid": "r" * 10_000},
            ):
                path = "/generate" if "text" in body else "/v1/completions"
                assert (await client.post(path, json=body)).status_code == 400, body
            ok = {"prompt": "p", "max_tokens": 1, "stop": ["\n"] * MAX_STOPS}
            assert (await client.post("/v1/completions", json=ok)).status_code == 200
            assert (await client.get("/health")).status_code == 200
    finally:
        await service.aclose()


# -- metrics --------------------------------------------------------------------------


def test_exposition_format() -> None:
    counter = Counter("kode_x_total", "Things.", ("kind",))
    counter.inc("a")
    counter.inc('b"\n', by=2.5)
    histogram = Histogram("kode_h_seconds", "Times.", (0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 7.0):
        histogram.observe(value)
    text = "\n".join([*counter.render(), *histogram.render()])
    assert text == (
        "# HELP kode_x_total Things.\n"
        "# TYPE kode_x_total counter\n"
        'kode_x_total{kind="a"} 1\n'
        'kode_x_total{kind="b\\"\\n"} 2.5\n'
        "# HELP kode_h_seconds Times.\n"
        "# TYPE kode_h_seconds histogram\n"
        'kode_h_seconds_bucket{le="0.1"} 2\n'
        'kode_h_seconds_bucket{le="1"} 3\n'
        'kode_h_seconds_bucket{le="+Inf"} 4\n'
        "kode_h_seconds_sum 7.65\n"
        "kode_h_seconds_count 4"
    )
    samples = parse_text(Metrics().render())
    assert samples["kode_generations_active"] == 0
    assert samples['kode_request_duration_seconds_bucket{le="+Inf"}'] == 0
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc()


# -- stop strings ---------------------------------------------------------------------


def test_find_stop_and_hold_back() -> None:
    stops = ["\n\n", "<|file_sep|>"]
    assert find_stop("a\n\nb", stops, 0) == (1, "\n\n")
    assert find_stop("ab<|file_sep|>\n\n", stops, 2) == (2, "<|file_sep|>")
    assert find_stop("abc", stops, 0) is None
    assert held_back("abc<|fi", stops) == 4
    assert held_back("abc\n", stops) == 1
    assert held_back("abc", stops) == 0
    assert held_back("", stops) == 0


async def test_service_applies_stop_strings_and_releases_everything() -> None:
    local = FakeLocal(chunks=["x = 1", "\n", "\ny = 2"])
    service = CompletionService(Workers([local]), max_per_key=1)
    job = service.start("k", GenerationRequest("p", 8), document="d", stop=["\n\n"])
    events = [e async for e in job.stream(0.5)]
    await asyncio.wait_for(job.task, 5)  # type: ignore[arg-type]
    assert job.text == "x = 1"
    assert events[-1] is not None
    assert getattr(events[-1], "matched", None) == "\n\n"
    assert service.jobs == []
    assert service.metrics.jobs_in_flight.get() == 0
    assert service.metrics.active.get() == 0
    await service.aclose()
    assert local.closed


async def test_a_superseding_request_keeps_its_place_in_line() -> None:
    local = FakeLocal(chunks=["a", "b"], delay=0.05)
    service = CompletionService(Workers([local], serial=True), max_per_key=4)

    def start(prompt: str, document: str) -> Job:
        return service.start("k", GenerationRequest(prompt, 4), document=document)

    first = start("A", "doc-a")
    await asyncio.sleep(0.01)  # A holds the backend
    waiting_b = start("B1", "doc-b")
    start("C", "doc-c")
    start("B2", "doc-b")  # replaces B1 where it waited, ahead of C
    lines = service.workers.lines
    assert lines is not None
    assert len(lines[0]) == 2
    async with asyncio.timeout(5):
        while service.jobs:
            await asyncio.sleep(0.02)
    assert [r.prompt for r in local.requests] == ["A", "B2", "C"]
    assert waiting_b.ended is not None
    assert waiting_b.ended.reason == "abort"
    assert first.text == "ab"
    assert service.metrics.aborted.get("superseded") == 1
    assert service.metrics.jobs_in_flight.get() == 0
    assert lines[0].holder is None
    await service.aclose()


def test_least_busy_spreads_and_round_robin_rotates() -> None:
    workers = Workers([FakeLocal(), FakeLocal(), FakeLocal()], Policy.LEAST_BUSY)
    picks = [workers.acquire() for _ in range(3)]
    assert sorted(picks) == [0, 1, 2]
    workers.release(1)
    assert workers.acquire() == 1
    rr = Workers([FakeLocal(), FakeLocal()], Policy.ROUND_ROBIN)
    assert [rr.acquire() for _ in range(4)] == [0, 1, 0, 1]


# -- the SGLang command line ----------------------------------------------------------


def sglang_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sglang_cli.register(parser.add_subparsers())
    return parser.parse_args(["sglang-command", *argv])


def test_sglang_command_single_server() -> None:
    args = sglang_args(
        "--target", "Qwen/Qwen2.5-Coder-7B-Instruct", "--draft", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "--algorithm", "standalone", "--num-steps", "3", "--topk", "1", "--num-draft-tokens", "4",
    )  # fmt: skip
    assert sglang_cli.build(args).lines() == [
        "python -m sglang.launch_server --model-path Qwen/Qwen2.5-Coder-7B-Instruct "
        "--speculative-algorithm STANDALONE "
        "--speculative-draft-model-path Qwen/Qwen2.5-Coder-0.5B-Instruct "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
        "--host 127.0.0.1 --port 30000"
    ]


def test_sglang_command_data_parallel_with_router() -> None:
    args = sglang_args("--target", "T", "--draft", "D", "--algorithm", "EAGLE3", "--dp", "2")
    assert sglang_cli.build(args).lines() == [
        "CUDA_VISIBLE_DEVICES=0 python -m sglang.launch_server --model-path T "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path D "
        "--host 127.0.0.1 --port 30001",
        "CUDA_VISIBLE_DEVICES=1 python -m sglang.launch_server --model-path T "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path D "
        "--host 127.0.0.1 --port 30002",
        "python -m sglang_router.launch_router --worker-urls http://127.0.0.1:30001 "
        "http://127.0.0.1:30002 --policy cache_aware --cb-failure-threshold 3 "
        "--host 127.0.0.1 --port 30000",
    ]
    remote = sglang_args(
        "--target", "T", "--algorithm", "NGRAM", "--num-draft-tokens", "8",
        "--worker-urls", "http://gpu1:30000", "http://gpu2:30000",
    )  # fmt: skip
    lines = sglang_cli.build(remote).lines()
    assert lines[0] == (
        "python -m sglang.launch_server --model-path T --speculative-algorithm NGRAM "
        "--speculative-num-draft-tokens 8 --host 0.0.0.0 --port 30000"
    )
    assert lines[2].startswith(
        "python -m sglang_router.launch_router --worker-urls http://gpu1:30000 http://gpu2:30000"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--draft", "D", "--algorithm", "EAGLE", "--num-steps", "3"], "all three tuning flags"),
        (["--algorithm", "EAGLE3"], "needs --draft"),
        (["--draft", "D", "--algorithm", "NGRAM"], "takes no --draft"),
        (["--algorithm", "NGRAM", "--topk", "2"], "only --num-draft-tokens"),
        (
            ["--draft", "D", "--algorithm", "EAGLE", "--dp", "3", "--worker-urls", "http://a:1"],
            "--dp 3 but 1 --worker-urls",
        ),
        (["--draft", "D", "--algorithm", "EAGLE", "--worker-urls", "gpu1:30000"], "http://HOST"),
    ],
)
def test_sglang_command_rejects_bad_combinations(argv: list[str], message: str) -> None:
    with pytest.raises(sglang_cli.CommandError, match=message):
        sglang_cli.build(sglang_args("--target", "T", *argv))


def test_sglang_command_cli() -> None:
    result = run_kode(["sglang-command", "--target", "T", "--algorithm", "NGRAM"])
    assert result.returncode == 0
    assert result.stdout.startswith("python -m sglang.launch_server --model-path T")
    bad = run_kode(["sglang-command", "--target", "T", "--algorithm", "EAGLE"])
    assert bad.returncode == 2
    assert "needs --draft" in bad.stderr
    run = run_kode(["sglang-command", "--target", "T", "--algorithm", "NGRAM", "--run"])
    assert run.returncode == 1
    assert "pip install 'kode[sglang]'" in run.stderr


# -- the backend factory --------------------------------------------------------------


async def test_factory_builds_remote_and_auto_backends() -> None:
    settings, problems = parse(
        {"backend": "remote", "remote": {"url": "http://gpu:30000/", "apiKey": "k"}}
    )
    assert problems == []
    backend = await load_backend(settings)
    assert isinstance(backend, SGLangBackend)
    assert backend.url == "http://gpu:30000"
    assert "<|file_sep|>" in backend.stop
    await backend.aclose()

    settings, _ = parse({"backend": "auto", "remote": {"url": "http://h:8000", "api": "openai"}})
    auto = await load_backend(settings)
    assert isinstance(auto, RoutingBackend)
    assert isinstance(auto.remote, OpenAIBackend)
    assert auto.local is None  # the local model is loaded only when needed
    await auto.aclose()


@pytest.mark.parametrize("url", ["", "gpu-box:30000"])
def test_factory_rejects_a_missing_or_bad_url(url: str) -> None:
    settings, _ = parse({"backend": "auto", "remote": {"url": url}})
    with pytest.raises(SettingsError, match=r"remote\.url"):
        build_remote(settings)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads", "100000"], "--threads must be 0 (every core) to"),
        (["--threads", "-1"], "--threads must be 0 (every core) to"),
        (["--context-size", "10"], "--context-size must be 512 to 131072"),
    ],
)
def test_serve_refuses_numbers_out_of_bounds(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #14 item 2, for ``kode serve``'s own flags: refused before anything starts."""
    from kode.cli.main import _parser

    args = _parser().parse_args(["serve", *argv])
    assert args.func(args) == 2
    assert message in capsys.readouterr().err
