"""SGLang's router in front of SGLang workers or ``kode serve`` workers: its command line.

``kode sglang-command --dp N`` prints it, and ``bench/router_chain.py`` runs it in front
of two ``kode serve`` workers (tests/test_router_e2e.py, ``kode bench load
--through-router``), so the line a team copies is the line that was tested.
"""

from __future__ import annotations

from collections.abc import Sequence

# sglang-router (0.3.2) retries a failed request up to 5 times, each time on the worker
# cache_aware picks: for a user whose prefix lives on a worker that died, that dead
# worker again, until its circuit breaker opens. It opens after 10 failures by default,
# and the request failed (HTTP 500 from the router); at 3 it opens within the request's
# own retries, which then go to the live worker (tests/test_router_e2e.py kills one).
CB_FAILURE_THRESHOLD = 3


def router_argv(python: str, urls: Sequence[str], host: str, port: int) -> tuple[str, ...]:
    """``sglang_router.launch_router`` in front of ``urls``, cache-aware."""
    return (
        python,
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *urls,
        "--policy",
        "cache_aware",
        "--cb-failure-threshold",
        str(CB_FAILURE_THRESHOLD),
        "--host",
        host,
        "--port",
        str(port),
    )
