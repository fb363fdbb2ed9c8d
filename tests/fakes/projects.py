"""Small projects written to disk for the tests of project context, and a small module of
shapes (``SHAPES``) the benchmarks' tests type back and cut into tasks."""

from __future__ import annotations

from pathlib import Path


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path.resolve()


def constants_project(root: Path) -> Path:
    """``starlette/endpoints.py:87`` in small: a module of status codes, whose outline
    costs far more tokens than its characters say, and definitions used at the cursor."""
    write(root, "web/__init__.py", "")
    write(
        root,
        "web/status.py",
        "".join(f"WS_{1000 + i}_CLOSE_REASON_{i} = {1000 + i}\n" for i in range(60)),
    )
    write(
        root,
        "web/concurrency.py",
        "async def run_until_first_complete_quill(*args):\n"
        '    """Run the awaitables given, return when the first one is done."""\n'
        "    return await first_of(args)\n\n\n"
        "async def run_in_threadpool_brisk(func, *args):\n"
        "    return await to_thread(func, *args)\n",
    )
    app = "from web import status\nfrom web.concurrency import run_until_first_complete_quill\n"
    app += "from web.concurrency import run_in_threadpool_brisk\n\n\nasync def dispatch(ws):\n"
    app += "    await run_until_first_complete_quill(ws)\n    await run_in_threadpool_brisk(ws)\n"
    app += "    code = status."
    return write(root, "web/endpoints.py", app)


SHAPES = """\
class Circle:
    def area(self) -> float:
        return math.pi * self.radius ** 2


class Square:
    def area(self) -> float:
        return self.side * self.side
"""
