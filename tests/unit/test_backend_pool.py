"""The composition root: one ``BackendKey`` says which settings a backend is built from,
for the loader and the pool alike. No model."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest
from fakes.completion import ScriptedBackend
from fakes.llama import ENDLESS, ClosingEngine, ToyEngineTarget, request
from kode.backends.base import FinishReason
from kode.backends.local import LocalBackend
from kode.backends.speculative import CostCurve
from kode.completion.backend_factory import BackendKey, BackendPool
from kode.completion.settings import DEFAULT, Settings
from test_local_close import STEP_S


async def test_the_pool_rebuilds_the_backend_when_and_only_when_its_key_changes() -> None:
    loaded: list[BackendKey] = []

    async def loader(key: BackendKey) -> ScriptedBackend:
        loaded.append(key)
        return ScriptedBackend(["x"])

    pool = BackendPool(loader)  # type: ignore[arg-type]
    first = await pool.get(DEFAULT)
    assert await pool.get(msgspec.structs.replace(DEFAULT, max_tokens=64)) is first
    # Read by the shared engine's loader: a change needs a new backend (it was ignored).
    changed = msgspec.structs.replace(DEFAULT, engine_idle_minutes=5)
    assert await pool.get(changed) is not first
    assert [k.engine_idle_minutes for k in loaded] == [30, 5]
    await pool.aclose()


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(BackendKey)])
def test_every_field_of_the_key_is_a_setting(field: str) -> None:
    assert field in {f.name for f in msgspec.structs.fields(Settings)}


def test_the_draft_model_counts_only_for_draft_speculation() -> None:
    small = msgspec.structs.replace(DEFAULT, draft_model="other")
    assert BackendKey.from_settings(small) == BackendKey.from_settings(DEFAULT)
    drafting = msgspec.convert({"speculation": "draft"}, Settings)
    assert BackendKey.from_settings(drafting).draft_model == "small"


async def test_a_settings_change_does_not_wait_for_the_old_backends_generations() -> None:
    """#51, bug 5: the next keystroke after a change of model got its backend only once
    every generation of the old one had run to its end; now they are cancelled."""
    engines: list[ClosingEngine] = []

    async def loader(key: BackendKey) -> LocalBackend[ToyEngineTarget]:
        engines.append(ClosingEngine(width=2))
        executor = ThreadPoolExecutor(max_workers=1)
        return LocalBackend(engines[-1], executor, curve=CostCurve({1: 1.0}), owns_executor=True)

    pool = BackendPool(loader)  # type: ignore[arg-type]
    old = await pool.get(DEFAULT)
    fill = await old.generate(request("def area(r):", ENDLESS))
    try:
        assert await asyncio.to_thread(engines[0].called.wait, STEP_S)  # it runs
        changed = msgspec.structs.replace(DEFAULT, context_size=2048)
        new = await asyncio.wait_for(pool.get(changed), STEP_S)
        assert new is not old and pool.current is new
        assert fill.stats.finish_reason is FinishReason.CANCELLED
        assert engines[0].closed.is_set()
    finally:
        await asyncio.wait_for(fill.cancel(), STEP_S)
        await asyncio.wait_for(pool.aclose(), STEP_S)
