"""Fill-in-the-middle prompt templates, as data.

Another model family is a new ``FimTemplate`` value, not new code. The layout
Qwen2.5-Coder was trained on (repository-level FIM, PSM order)::

    <|repo_name|>{repo}
    <|file_sep|>{other path}
    {other text}
    <|file_sep|>{path}
    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

Parts that change least come first (other files, then this file's prefix), so a
keystroke invalidates as little of the cached prompt as possible.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class FimOrder(enum.StrEnum):
    PSM = "psm"  # prefix, suffix, middle
    SPM = "spm"  # suffix, prefix, middle


@dataclass(frozen=True, slots=True)
class FimTemplate:
    name: str
    prefix: str
    suffix: str
    middle: str
    order: FimOrder = FimOrder.PSM
    repo_header: str | None = None  # "{repo}" is replaced by the repository name
    file_header: str | None = None  # "{path}" is replaced by the file path
    stop_texts: tuple[str, ...] = ()  # texts that end a completion if the model writes them


QWEN25_CODER = FimTemplate(
    name="qwen2.5-coder",
    prefix="<|fim_prefix|>",
    suffix="<|fim_suffix|>",
    middle="<|fim_middle|>",
    order=FimOrder.PSM,
    repo_header="<|repo_name|>{repo}\n",
    file_header="<|file_sep|>{path}\n",
    stop_texts=(
        "<|endoftext|>",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|file_sep|>",
        "<|repo_name|>",
        "<|im_end|>",
        "<|im_start|>",
    ),
)

# The same tokens in SPM order (suffix first), so that typing at the end of the prefix
# would not invalidate the cached suffix. Measured with `kode bench quality --modes spm`
# (docs/benchmarks.md): 0/20 single-line and 0/20 multi-line HumanEval infilling tasks on the
# 1.5B against 16/20 and 9/20 in PSM order; the model restarts the file, so PSM stays.
QWEN25_CODER_SPM = FimTemplate(
    name="qwen2.5-coder-spm",
    prefix=QWEN25_CODER.prefix,
    suffix=QWEN25_CODER.suffix,
    middle=QWEN25_CODER.middle,
    order=FimOrder.SPM,
    repo_header=QWEN25_CODER.repo_header,
    file_header=QWEN25_CODER.file_header,
    stop_texts=QWEN25_CODER.stop_texts,
)

TEMPLATES: dict[str, FimTemplate] = {t.name: t for t in (QWEN25_CODER, QWEN25_CODER_SPM)}


@dataclass(frozen=True, slots=True)
class Snippet:
    """Another file's text offered to the model as repository context."""

    path: str
    text: str


def render(
    template: FimTemplate,
    prefix: str,
    suffix: str,
    *,
    path: str | None = None,
    repo: str | None = None,
    snippets: Sequence[Snippet] = (),
) -> str:
    """The prompt text for one completion.

    Example (Qwen2.5-Coder, no repository context)::

        render(QWEN25_CODER, "def add(a, b):\\n    ", "\\n")
        == "<|fim_prefix|>def add(a, b):\\n    <|fim_suffix|>\\n<|fim_middle|>"
    """
    head = ""
    use_repo = template.file_header is not None and (snippets or path)
    if use_repo and template.repo_header is not None and repo is not None:
        head += template.repo_header.format(repo=repo)
    if use_repo and template.file_header is not None:
        for snippet in snippets:
            body = snippet.text if snippet.text.endswith("\n") else snippet.text + "\n"
            head += template.file_header.format(path=snippet.path) + body
        if path is not None:
            head += template.file_header.format(path=path)
    if template.order is FimOrder.PSM:
        fim = f"{template.prefix}{prefix}{template.suffix}{suffix}{template.middle}"
    else:
        fim = f"{template.suffix}{suffix}{template.prefix}{prefix}{template.middle}"
    return head + fim
