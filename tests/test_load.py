"""A short run of the load test: typing users, latest-wins aborts, nothing left running."""

from __future__ import annotations

import json

import pytest
from kode.cli.main import main as kode

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_short_load_run_leaves_nothing_running(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--users", "4", "--seconds", "4", "--spawn-server", "--model", "small"]
    argv += ["--threads", "1", "--max-tokens", "8", "--request-timeout", "60", "--json"]
    assert kode(["bench", "load", *argv]) == 0
    report = json.loads(capsys.readouterr().out)
    shown = json.dumps(report)  # the errors it met, in every message
    assert report["leftRunning"] == 0, shown
    assert report["requests"] >= 8, shown
    assert report["failed"] == 0, shown
    assert report["busy429"] == 0, shown
    assert report["abortedSeenByClients"] >= 1, shown  # keystrokes superseded earlier requests
    assert report["server"]["abortedSuperseded"] >= report["abortedSeenByClients"], shown
    assert report["completed"] + report["abortedSeenByClients"] == report["requests"], shown


def test_short_load_run_through_the_router(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #33's bar: a user's keystrokes stay on one worker (affinity >= 90%), four
    users use both workers, and no generation is left running anywhere after the aborts."""
    argv = ["--through-router", "--users", "4", "--seconds", "4", "--max-tokens", "8"]
    argv += ["--request-timeout", "60", "--json"]
    assert kode(["bench", "load", *argv]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["leftRunning"] == 0
    assert report["failed"] == 0
    assert report["abortedSeenByClients"] >= 1
    router = report["router"]
    assert router["affinity"] >= 0.9, router
    assert sorted(router["users"]) == ["worker-0", "worker-1"], router
    for worker in router["workers"].values():
        assert worker["leftRunning"] == 0
    assert sum(w["abortedDisconnect"] for w in router["workers"].values()) >= 1
