"""The composition root: one ``BackendKey`` says which settings a backend is built from,
for the loader and the pool alike. No model."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from kode.completion.backend_factory import BackendKey, BackendPool
from kode.completion.settings import DEFAULT, Settings
from scripted import ScriptedBackend


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
