"""The editor installer's pure parts (editors/install/kode_install.py): what it reads from
the source, what it says a machine lacks and the command it names, the disk space the
remaining steps need, and the progress fractions. The installer as a process, with its
steps, is tests/process/test_install_script.py."""

from __future__ import annotations

import doctest
import io
import json
import sys
import tomllib
from pathlib import Path

import pytest
from fakes.install_steps import ROOT, STEPS, ki
from kode.backends.llama import build_flags


def test_the_installers_examples_hold() -> None:
    result = doctest.testmod(ki, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 6 and result.failed == 0


def test_the_source_folder_gives_pyprojects_version_pin_and_this_cpus_flags() -> None:
    source = ki.Source(str(ROOT))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert source.version == project["version"]
    assert f"llama-cpp-python=={source.llama_pin}" in project["dependencies"]
    assert not source.is_wheel and source.identity() is None  # installed anew each run
    assert source.cmake_args().split() == build_flags.for_this_machine()


def test_the_vscode_extension_has_kodes_version() -> None:
    # It installs the wheel it carries and names a server of another version.
    package = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text())
    assert package["version"] == ki.Source(str(ROOT)).version


def test_a_folder_that_is_not_kode_is_refused() -> None:
    with pytest.raises(ki.InstallError) as caught:
        ki.Source(str(ROOT / "editors"))
    assert caught.value.status == ki.USAGE
    assert "neither a Kode wheel" in caught.value.message


@pytest.mark.parametrize(
    ("os_release", "kind", "compiler"),
    [
        ('ID=debian\nVERSION_ID="12"\n', "debian", "sudo apt install build-essential"),
        ("ID=ubuntu\nID_LIKE=debian\n", "debian", "sudo apt install build-essential"),
        ('ID="fedora"\n', "fedora", "sudo dnf install gcc gcc-c++"),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', "fedora", "sudo dnf install gcc gcc-c++"),
    ],
)
def test_each_system_gets_its_one_command(os_release: str, kind: str, compiler: str) -> None:
    assert ki.system_kind(os_release) == kind
    assert ki.fix_for("compiler", kind) == compiler


def test_an_unknown_system_gets_every_known_systems_command() -> None:
    fix = ki.fix_for("python", ki.system_kind("ID=arch\n"))
    assert fix == (
        "Debian/Ubuntu: sudo apt install python3.11 python3.11-venv; "
        "Fedora: sudo dnf install python3.11; macOS: brew install python@3.12"
    )


def test_python_3_10_is_refused_and_3_11_taken() -> None:
    ki.check_python((3, 11, 0), "/usr/bin/python3", "debian")
    ki.check_python((3, 13, 1), "/usr/bin/python3", "debian")
    with pytest.raises(ki.InstallError) as caught:
        ki.check_python((3, 10, 12), "/usr/bin/python3", "macos")
    assert caught.value.message == (
        "Kode needs Python 3.11 or newer; /usr/bin/python3 is Python 3.10.12"
    )
    assert caught.value.fix == "brew install python@3.12"
    assert caught.value.status == ki.LACKING


def test_a_python_without_ensurepip_names_its_venv_package() -> None:
    ki.check_venv("debian")  # this one has it
    with pytest.raises(ki.InstallError) as caught:
        ki.check_venv("debian", lambda name: None if name == "ensurepip" else object())
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert caught.value.fix == f"sudo apt install python{minor}-venv"
    assert "cannot make virtual environments" in caught.value.message


def test_disk_needs_on_two_file_systems_are_checked_apart(tmp_path: Path) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    cache.mkdir()
    gib = ki.GIB
    needs = [
        [ki.Need(str(data / "server" / "tmp"), 1 * gib, "the build", True)],
        [ki.Need(str(data / "server" / "env"), 2 * gib, "the environment")],
        [ki.Need(str(cache / "kode" / "models"), 2 * gib, "the models")],
    ]

    def check(free: dict[Path, float]) -> None:
        # Folders not made yet count on their nearest existing parent's file system.
        ki.check_disk(
            needs,
            free=lambda folder: int(free[Path(folder)] * gib),
            device=lambda folder: hash(folder),
        )

    check({data: 2, cache: 2})
    with pytest.raises(ki.InstallError) as caught:
        check({data: 2, cache: 1.9})
    assert caught.value.message == (
        f"not enough disk space in {cache}: 2.0 GiB needed at the most (the models 2.0), "
        "1.9 GiB free"
    )
    with pytest.raises(ki.InstallError) as caught:
        check({data: 1.9, cache: 2})
    assert "2.0 GiB needed at the most (the build 1.0, the environment 2.0)" in str(caught.value)


def test_progress_reports_each_steps_share_of_the_whole() -> None:
    out = io.StringIO()
    progress = ki.Progress(STEPS, out)
    assert progress.overall("venv", 0.0) == 0.0
    assert progress.overall("fetch", 0.5) == pytest.approx(0.1 + 0.15)
    assert progress.overall("finish", 1.0) == 1.0
    progress.reporter("fetch")(fraction=0.5, message="[1/2] one")
    assert json.loads(out.getvalue()) == {
        "event": "progress",
        "step": "fetch",
        "fraction": 0.5,
        "overall": 0.25,
        "message": "[1/2] one",
    }


def test_the_real_steps_weights_add_up_to_the_whole() -> None:
    assert [s.name for s in ki.STEPS] == ["venv", "pip", "llama", "kode", "models"]
    assert sum(s.weight for s in ki.STEPS) == pytest.approx(1.0)


def test_the_kept_llama_wheel_is_keyed_by_the_python_abi_not_its_patch_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel built by one 3.11 serves another (the real editor install tests seed the
    fresh install with the wheel a 3.11.7 built, and the editor finds a 3.11.2)."""
    source = ki.Source(str(ROOT))
    keys = set()
    for release in ("3.11.2", "3.11.7"):
        monkeypatch.setattr(ki.platform, "python_version", lambda release=release: release)
        runner = ki.Runner(io.BytesIO(), {}, echo=False)
        keys.add(ki.Plan(str(tmp_path), source, runner).llama_key)
    assert len(keys) == 1, keys
