"""What a terminal shows: `tmux capture-pane -p -e` parsed into cells, and drawn as a PNG.

capture-pane -e writes each screen row as text with SGR escapes (colours, bold, italic)
wherever the attributes change. Parsing them back into cells lets a test tell apart text
in different colours, such as ghost text from typed text, exactly as a person sees it.

>>> screen = parse("ab\\x1b[38;2;1;2;3mcd\\x1b[0me\\nx")
>>> screen.rows[0]
'abcde'
>>> screen.in_colour(0, (1, 2, 3))
'cd'
>>> [c.style.strikethrough for c in parse("a\x1b[9mb\x1b[29mc").cells[0]]
[False, True, False]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

RGB = tuple[int, int, int]

# The terminal's own colours, where the application sets none (Neovim's default dark
# scheme sets its own for every cell it draws, so these show only at the edges).
DEFAULT_FG: RGB = (224, 226, 234)
DEFAULT_BG: RGB = (20, 22, 27)

_SGR = re.compile(r"\x1b\[([0-9;:]*)m")
_OTHER_ESCAPE = re.compile(r"\x1b(?:\[[0-9;?]*[A-Za-ln-z]|\][^\x07]*\x07|[()][0-9A-B])")

# xterm's 16 colours, for SGR 30-37/90-97 and 38;5;0-15.
_ANSI16: tuple[RGB, ...] = (
    (0, 0, 0), (205, 0, 0), (0, 205, 0), (205, 205, 0),
    (0, 0, 238), (205, 0, 205), (0, 205, 205), (229, 229, 229),
    (127, 127, 127), (255, 0, 0), (0, 255, 0), (255, 255, 0),
    (92, 92, 255), (255, 0, 255), (0, 255, 255), (255, 255, 255),
)  # fmt: skip


@dataclass(frozen=True)
class Style:
    fg: RGB | None = None
    bg: RGB | None = None
    bold: bool = False
    italic: bool = False
    underline: bool = False
    reverse: bool = False
    strikethrough: bool = False


@dataclass(frozen=True)
class Cell:
    char: str
    style: Style


@dataclass(frozen=True)
class Screen:
    cells: tuple[tuple[Cell, ...], ...]

    @property
    def rows(self) -> list[str]:
        """Each row's text, trailing blanks removed."""
        return ["".join(c.char for c in row).rstrip() for row in self.cells]

    def in_colour(self, row: int, fg: RGB) -> str:
        """The characters of `row` drawn in foreground colour `fg`, in order."""
        if row >= len(self.cells):
            return ""
        return "".join(c.char for c in self.cells[row] if c.style.fg == fg)

    def rows_with_colour(self, fg: RGB) -> list[int]:
        return [i for i in range(len(self.cells)) if self.in_colour(i, fg).strip()]

    @property
    def text(self) -> str:
        return "\n".join(self.rows)


def _colour(params: list[int], i: int) -> tuple[RGB | None, int]:
    """The colour of an extended SGR (38/48) starting at params[i]; and the next index."""
    if i + 1 < len(params) and params[i + 1] == 2 and i + 4 < len(params):
        r, g, b = params[i + 2 : i + 5]
        return (r, g, b), i + 5
    if i + 1 < len(params) and params[i + 1] == 5 and i + 2 < len(params):
        return _xterm256(params[i + 2]), i + 3
    return None, len(params)


def _xterm256(n: int) -> RGB:
    if n < 16:
        return _ANSI16[n]
    if n < 232:
        n -= 16
        steps = (0, 95, 135, 175, 215, 255)
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    grey = 8 + 10 * (n - 232)
    return grey, grey, grey


def _apply(style: Style, codes: str) -> Style:
    params = [int(p) if p else 0 for p in codes.replace(":", ";").split(";")]
    i = 0
    while i < len(params):
        p = params[i]
        i += 1
        if p == 0:
            style = Style()
        elif p == 1:
            style = replace(style, bold=True)
        elif p == 3:
            style = replace(style, italic=True)
        elif p == 4:
            style = replace(style, underline=True)
        elif p == 7:
            style = replace(style, reverse=True)
        elif p == 9:
            style = replace(style, strikethrough=True)
        elif p == 22:
            style = replace(style, bold=False)
        elif p == 23:
            style = replace(style, italic=False)
        elif p == 24:
            style = replace(style, underline=False)
        elif p == 27:
            style = replace(style, reverse=False)
        elif p == 29:
            style = replace(style, strikethrough=False)
        elif 30 <= p <= 37 or 90 <= p <= 97:
            style = replace(style, fg=_ANSI16[p - 30 if p < 90 else p - 82])
        elif 40 <= p <= 47 or 100 <= p <= 107:
            style = replace(style, bg=_ANSI16[p - 40 if p < 100 else p - 92])
        elif p == 39:
            style = replace(style, fg=None)
        elif p == 49:
            style = replace(style, bg=None)
        elif p in (38, 48):
            colour, i = _colour(params, i - 1)
            style = replace(style, fg=colour) if p == 38 else replace(style, bg=colour)
    return style


def parse(captured: str, width: int | None = None) -> Screen:
    """Cells of `tmux capture-pane -p -e` output; rows padded to `width` with blanks."""
    rows: list[tuple[Cell, ...]] = []
    style = Style()
    for line in captured.split("\n"):
        cells: list[Cell] = []
        line = _OTHER_ESCAPE.sub("", line)
        pos = 0
        for match in _SGR.finditer(line):
            cells.extend(Cell(ch, style) for ch in line[pos : match.start()])
            style = _apply(style, match.group(1))
            pos = match.end()
        cells.extend(Cell(ch, style) for ch in line[pos:])
        if width is not None and len(cells) < width:
            # tmux leaves out trailing blanks; they carry the row's last background.
            cells.extend([Cell(" ", Style(bg=style.bg))] * (width - len(cells)))
        rows.append(tuple(cells))
    while rows and not rows[-1]:
        rows.pop()
    return Screen(tuple(rows))


def render_png(screen: Screen, path: Path, title: str | None = None) -> None:
    """Draw the screen as a terminal would, in DejaVu Sans Mono (shipped with matplotlib)."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    size = 16

    def font(bold: bool, italic: bool) -> ImageFont.FreeTypeFont:
        name = (
            "DejaVuSansMono"
            + {
                (False, False): "",
                (True, False): "-Bold",
                (False, True): "-Oblique",
                (True, True): "-BoldOblique",
            }[bold, italic]
        )
        return ImageFont.truetype(str(fonts / f"{name}.ttf"), size)

    regular = font(False, False)
    _, top, _, bottom = regular.getbbox("M")
    cell_w = round(regular.getlength("M"))
    cell_h = round(size * 1.35)
    pad = 12
    title_h = cell_h + 8 if title else 0
    cols = max((len(r) for r in screen.cells), default=1)
    image = Image.new(
        "RGB",
        (cols * cell_w + 2 * pad, len(screen.cells) * cell_h + 2 * pad + title_h),
        DEFAULT_BG,
    )
    draw = ImageDraw.Draw(image)
    if title:
        draw.rectangle((0, 0, image.width, title_h), fill=(44, 47, 54))
        draw.text((pad, 4), title, font=regular, fill=(200, 203, 210))
    for y, row in enumerate(screen.cells):
        for x, cell in enumerate(row):
            fg, bg = cell.style.fg or DEFAULT_FG, cell.style.bg or DEFAULT_BG
            if cell.style.reverse:
                fg, bg = bg, fg
            x0, y0 = pad + x * cell_w, pad + title_h + y * cell_h
            draw.rectangle((x0, y0, x0 + cell_w, y0 + cell_h), fill=bg)
            if cell.char != " ":
                face = font(cell.style.bold, cell.style.italic)
                draw.text(
                    (x0, y0 + (cell_h - (bottom - top)) // 2 - top), cell.char, font=face, fill=fg
                )
            if cell.style.underline:
                draw.line((x0, y0 + cell_h - 2, x0 + cell_w, y0 + cell_h - 2), fill=fg)
            if cell.style.strikethrough:
                draw.line((x0, y0 + cell_h // 2, x0 + cell_w, y0 + cell_h // 2), fill=fg)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
