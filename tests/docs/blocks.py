"""The code blocks of the README and the docs site, as the docs tests (and the e2e tests of the apps the
docs show) read them.

A block is a fenced code block. The line just before it may say how the tests run it:

    <!-- example: system -->                           needs Redis, a worker, an orchestrator and the API
    <!-- example: cli -->                              `toolloop` commands run against that system
    <!-- example: app, run by tests/e2e/test_x.py -->  a web app another test serves and drives
    <!-- example: skip (why it cannot run) -->        not run; the reason is required, and few may

A Python block with `title="path.py"` is a file of the example project the docs build up (written at that
path); any other Python block is a script. Lines `#> ...` in a block are the output it must print, in order
(`…` matches anything).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The design notes are prose of their own, with no examples to run.
EXCLUDED = ("docs/design/",)

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<language>[\w+-]*)(?P<attrs>[^`\n]*)$")
# An output line's marker, `#>` or (as `ruff format` writes it) `# >`.
OUTPUT_MARKER = re.compile(r"^# ?>")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
_MARKER = re.compile(r"^\s*<!-- example: (?P<marker>.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # relative to the repository's root
    line: int  # of the opening fence, 1-based
    language: str
    title: str | None
    marker: str | None
    code: str

    @property
    def id(self) -> str:
        """`page:line`, the block's name in test ids and messages."""
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        """`python`, `system`, `cli`, `app` or `skip`: how the tests run it (`python` for a plain block)."""
        if self.marker is None:
            return "python"
        return self.marker.split(",")[0].split(" ")[0]

    @property
    def is_file(self) -> bool:
        """A file of the example project (`title="path.py"`), not a script."""
        return self.title is not None and self.title.endswith(".py")

    @property
    def expected_output(self) -> list[str]:
        """The `#> ` lines: what running the block prints, in order. `ruff format` writes the marker as `# >`
        in the blocks it formats; both are markers."""
        return [
            OUTPUT_MARKER.sub("", line.strip(), count=1).removeprefix(" ") for line in self._output_lines()
        ]

    def _output_lines(self) -> Iterator[str]:
        for line in self.code.splitlines():
            if OUTPUT_MARKER.match(line.lstrip()):
                yield line.lstrip()


def read_blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file at `path`, with the marker line before it."""
    lines = path.read_text().splitlines()
    page = path.relative_to(ROOT).as_posix()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body: list[str] = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        title = _TITLE.search(opening["attrs"])
        blocks.append(
            Block(
                page=page,
                line=index + 1,
                language=opening["language"],
                title=title["title"] if title else None,
                marker=_marker_before(lines, index),
                code="\n".join(body) + "\n",
            )
        )
        index = end + 1
    return blocks


def _marker_before(lines: list[str], index: int) -> str | None:
    before = index - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    found = _MARKER.match(lines[before]) if before >= 0 else None
    return found["marker"] if found else None


def doc_pages() -> list[Path]:
    """The README and every page of the docs site but the design notes."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if not p.relative_to(ROOT).as_posix().startswith(EXCLUDED)]


def all_blocks() -> list[Block]:
    """Every block of every page, in page order."""
    return [block for page in doc_pages() for block in read_blocks(page)]


def python_block(page: str, title: str) -> str:
    """The code of the Python block titled `title` on `page` (e.g. the FastAPI apps the e2e tests serve)."""
    (block,) = [b for b in read_blocks(ROOT / page) if b.language == "python" and b.title == title]
    return block.code
