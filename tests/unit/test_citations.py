"""Nothing in the repository cites a file it lacks.

The design notes live in `docs/design/`, in the project's own words. A comment or a docstring that explains a
rule shared by several modules points there — `docs/design/tool-calls.md, "One answer per call"` — and this
test keeps every such pointer true: the page exists and, when a section is named, the page has that heading.
No tracked file outside `docs/` may cite the team's working notes, which live outside the repository: their
file names, or their numbered sections ("§4.9"). Files are listed with `git ls-files`, so what is checked is
what a clone holds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The outside notes' names, each spelled with a character class so that this file does not cite them.
OUTSIDE_NOTES = re.compile(r"\bS[P]EC\.md\b|\bA[R]CHITECTURE\b|\bS[P]EC\s*§")
# A numbered section ("§4.9", "(§5.6)"): the outside notes' way of citing. An RFC's sections are fine.
SECTION = re.compile(r"§\s*\d")
RFC_BEFORE = re.compile(r"RFC\s*\d+\s*$")
# A pointer at a page of the docs, optionally followed by the section it means: docs/x.md, "Heading".
POINTER = re.compile(r"\bdocs/[\w./-]+?\.md\b(?:,\s+\"([^\"\n]+)\")?")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# This file: its own cases are examples of what it refuses.
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()


def tracked_text_files() -> list[tuple[str, str]]:
    """(path, text) of every tracked file outside `docs/` that exists and reads as UTF-8 text."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run([git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30)
    files = []
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or name.startswith("docs/") or name == SELF or not path.is_file():
            continue
        try:
            files.append((name, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return files


def find_outside_citations(text: str) -> list[str]:
    """The citations of the outside notes in `text`, as `line N: text` (pure)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        cited = OUTSIDE_NOTES.search(line) or any(
            not RFC_BEFORE.search(line[: match.start()]) for match in SECTION.finditer(line)
        )
        if cited:
            found.append(f"line {number}: {line.strip()}")
    return found


def headings(page: Path) -> set[str]:
    """The headings of a markdown page, as written."""
    return {match.group(1) for match in HEADING.finditer(page.read_text(encoding="utf-8"))}


def find_broken_pointers(text: str, root: Path) -> list[str]:
    """The pointers in `text` at a docs page that does not exist, or at a section the page lacks (pure but
    for reading the pages)."""
    broken = []
    for match in POINTER.finditer(text):
        page = root / match.group(0).split(",")[0]
        section = match.group(1)
        if not page.is_file():
            broken.append(f"{match.group(0)}: no such page")
        elif section is not None and section not in headings(page):
            broken.append(f"{match.group(0)}: the page has no section {section!r}")
    return broken


def test_nothing_cites_the_outside_notes() -> None:
    cited = {name: found for name, text in tracked_text_files() if (found := find_outside_citations(text))}
    assert cited == {}, "say the why, or point at docs/design/<page>.md, instead of citing notes outside it"


def test_every_docs_pointer_is_true() -> None:
    files = tracked_text_files()
    broken = {name: found for name, text in files if (found := find_broken_pointers(text, ROOT))}
    assert broken == {}


@pytest.mark.parametrize(
    ("line", "cited"),
    [
        ("First writer wins (S" + "PEC §4.9).", True),
        ("see A" + "RCHITECTURE.md", True),
        ("the terminal shapes (§5.6)", True),
        ("its chunked body (RFC 9112 §7.1)", False),
        ('First writer wins (docs/design/tool-calls.md, "One answer per call").', False),
        ("a SPECIAL case, the spec of a tool", False),
    ],
)
def test_citations_found(line: str, cited: bool) -> None:
    assert bool(find_outside_citations(line)) is cited


def test_pointers_checked(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## One answer per call\n", encoding="utf-8")
    assert find_broken_pointers('docs/page.md, "One answer per call"; docs/page.md', tmp_path) == []
    assert find_broken_pointers("see docs/missing.md", tmp_path) == ["docs/missing.md: no such page"]
    assert find_broken_pointers('docs/page.md, "Two answers"', tmp_path) == [
        "docs/page.md, \"Two answers\": the page has no section 'Two answers'"
    ]
