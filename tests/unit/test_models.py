"""Model provisioning from split PyPI packages, with fake part packages built on disk."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kode.backends import models
from kode.backends.errors import ModelError, ModelPartMissing

PARTS = [b"GGUF" + b"a" * 1000, b"b" * 700, b"c" * 33]
WHOLE = b"".join(PARTS)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_part(site: Path, index: int, data: bytes, *, record_data: bytes | None = None) -> None:
    """An installed distribution ``fakemodel-part{index}`` 1.0 holding ``data/partNN.bin``."""
    name = f"fakemodel_part{index}"
    pkg = site / name / "data"
    pkg.mkdir(parents=True)
    (pkg / f"part{index:02d}.bin").write_bytes(data)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: fakemodel-part{index}\nVersion: 1.0\n"
    )
    recorded = data if record_data is None else record_data
    (info / "RECORD").write_text(
        f"{name}/data/part{index:02d}.bin,sha256={_b64(recorded)},{len(data)}\n"
        f"{name}-1.0.dist-info/METADATA,,\n{name}-1.0.dist-info/RECORD,,\n"
    )


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    site = tmp_path / "site"
    site.mkdir()
    sys.path.insert(0, str(site))
    try:
        yield site
    finally:
        sys.path.remove(str(site))


def spec(size: int = len(WHOLE), digest: str | None = None) -> models.ModelSpec:
    return models.ModelSpec(
        alias="fake",
        title="Fake model",
        filename="fake.gguf",
        package_prefix="fakemodel-part",
        n_parts=len(PARTS),
        version="1.0",
        sha256=digest or hashlib.sha256(WHOLE).hexdigest(),
        size=size,
    )


def env(tmp_path: Path) -> dict[str, str]:
    return {"KODE_MODEL_DIR": str(tmp_path / "models")}


class CountingProgress(models.Progress):
    def __init__(self) -> None:
        self.total = 0

    def update(self, n: int) -> None:
        self.total += n


def test_install_assembles_verifies_and_is_idempotent(site: Path, tmp_path: Path) -> None:
    for i, data in enumerate(PARTS, start=1):
        make_part(site, i, data)
    bars: list[CountingProgress] = []

    def progress(total: int, desc: str) -> models.Progress:
        bars.append(CountingProgress())
        return bars[-1]

    path = models.install(spec(), progress=progress, environ=env(tmp_path))
    assert path.read_bytes() == WHOLE
    assert bars[0].total == len(WHOLE)
    assert not list(path.parent.glob(".*partial"))  # nothing half-written left behind
    mtime = path.stat().st_mtime_ns
    assert models.install(spec(), progress=progress, environ=env(tmp_path)) == path
    assert path.stat().st_mtime_ns == mtime  # not assembled twice, but hashed again
    assert [bar.total for bar in bars] == [len(WHOLE), len(WHOLE)]


def test_missing_part_names_the_package_to_install(site: Path, tmp_path: Path) -> None:
    make_part(site, 1, PARTS[0])
    make_part(site, 3, PARTS[2])
    with pytest.raises(ModelPartMissing) as err:
        models.install(spec(), progress=models.no_progress, environ=env(tmp_path))
    message = str(err.value)
    assert "fakemodel-part2" in message and "pip install 'fakemodel-part2==1.0'" in message
    assert "\n" not in message
    assert not (tmp_path / "models" / "fake.gguf").exists()


def test_corrupt_part_is_named_and_nothing_is_installed(site: Path, tmp_path: Path) -> None:
    make_part(site, 1, PARTS[0])
    make_part(site, 2, b"x" * 700, record_data=PARTS[1])  # same size, wrong bytes
    make_part(site, 3, PARTS[2])
    with pytest.raises(ModelPartMissing) as err:
        models.install(spec(), progress=models.no_progress, environ=env(tmp_path))
    assert "fakemodel-part2 is damaged" in str(err.value)
    assert not (tmp_path / "models" / "fake.gguf").exists()
    assert not list((tmp_path / "models").glob(".*partial"))


def test_wrong_whole_sum_is_refused(site: Path, tmp_path: Path) -> None:
    for i, data in enumerate(PARTS, start=1):
        make_part(site, i, data)
    with pytest.raises(ModelError, match="sha256"):
        models.install(spec(digest="0" * 64), progress=models.no_progress, environ=env(tmp_path))
    assert not (tmp_path / "models" / "fake.gguf").exists()


def test_any_gguf_path_works_and_bad_paths_are_clear(tmp_path: Path) -> None:
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF....")
    assert models.resolve(str(good)) == good
    with pytest.raises(ModelError, match="not found"):
        models.resolve(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelError, match="not a GGUF"):
        models.resolve(str(bad))
    with pytest.raises(ModelError, match="hf:OWNER/REPO/FILE"):
        models.resolve("hf:only-owner")


@pytest.fixture
def installed(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for i, data in enumerate(PARTS, start=1):
        make_part(site, i, data)
    monkeypatch.setitem(models.DEFAULT_MODELS, "fake", spec())
    monkeypatch.setenv("KODE_MODEL_DIR", str(tmp_path / "models"))
    return models.install("fake", progress=models.no_progress)


def _damage(path: Path, *, keep_mtime: bool) -> None:
    before = path.stat()
    with open(path, "r+b") as handle:  # same size, 4 bytes overwritten
        handle.seek(900)
        handle.write(b"!!!!")
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["touched", "mtime-kept"])
def test_a_damaged_cached_model_is_noticed_and_rebuilt(
    installed: Path, keep_mtime: bool, caplog: pytest.LogCaptureFixture
) -> None:
    assert models.check_installed(installed, spec()) is models.Check.VERIFIED
    _damage(installed, keep_mtime=keep_mtime)
    assert models.check_installed(installed, spec()) is models.Check.DAMAGED
    with pytest.raises(ModelError, match="kode model install fake --force"):
        models.resolve("fake", auto_install=False, progress=models.no_progress)
    assert models.resolve("fake", progress=models.no_progress) == installed
    assert installed.read_bytes() == WHOLE
    assert "damaged; rebuilding it from its parts" in caplog.text
    assert models.check_installed(installed, spec()) is models.Check.VERIFIED


def test_a_damaged_model_without_its_parts_says_how(installed: Path, site: Path) -> None:
    _damage(installed, keep_mtime=False)
    for info in site.glob("fakemodel_part2-*.dist-info"):
        (info / "METADATA").unlink()
        info.rename(info.with_suffix(".gone"))
    with pytest.raises(ModelPartMissing, match="damaged and cannot be rebuilt") as err:
        models.resolve("fake", progress=models.no_progress)
    assert "pip install 'fakemodel-part2==1.0'" in str(err.value)


def test_install_and_verify_hash_the_whole_file(
    installed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kode.cli.main import main

    assert main(["model", "info", "--verify", "--json"]) == 0
    _damage(installed, keep_mtime=True)
    assert main(["model", "info", "--verify"]) == 1
    assert "DAMAGED" in capsys.readouterr().out
    assert main(["model", "info"]) == 1  # the partial hash sees it too
    models.install("fake", progress=models.no_progress)  # hashes, so it reassembles
    assert installed.read_bytes() == WHOLE


def test_a_killed_install_leaves_nothing_for_long(installed: Path) -> None:
    stale = installed.with_name(f".{installed.name}.99999.partial")
    stale.write_bytes(b"half")
    models.install("fake", progress=models.no_progress)
    assert not stale.exists()


def test_kode_model_dir_pointing_at_a_file_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kode.cli.main import main

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("KODE_MODEL_DIR", str(not_a_dir))
    assert main(["model", "install", "small"]) == 1
    err = capsys.readouterr().err
    assert "KODE_MODEL_DIR" in err and "Traceback" not in err and err.count("\n") == 1
