"""The code blocks of the README and the docs site, and how each one is run by the suite.

A block runs in the suite unless it is a shell session or marked as an excerpt. The mark is
an HTML comment on the line before the fence (invisible on the site and on GitHub):

- ``<!-- excerpt -->``: a fragment shown for reading (a config line, a method body); not run.
- ``<!-- tested: tests/integration/test_x.py -->``: a test in that file selects the block with
  ``block_with("some text of it")`` and runs it with its own setup and checks.
- ``<!-- serve: tasks:app -->``: run while a pool serves ``tasks:app`` from the page's folder.
- no mark: run as a script, in order with the page's other blocks, in one folder per page.

A block whose fence has ``title="tasks.py"`` is that file of the page's folder: written there
(for the blocks after it to import or serve), not run by itself. ``redis://localhost:6379`` in
any block is replaced by the test's own Redis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

SHELL = frozenset({"sh", "console", "bash", "shell"})
"""Shell sessions: shown, never run (the commands they show are run by their own tests)."""
OUTPUT = frozenset({"text"})
"""What a command prints, or a drawing: not code."""

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>excerpt|tested|serve)\s*(?::\s*(?P<arg>[^>]*?))?\s*-->\s*$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    title: str | None
    mark: str | None
    """``excerpt``, ``tested`` or ``serve``; None for a block run as a script (or a titled file)."""
    argument: str | None
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, in order, with the mark on the line before each."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent, info = opening["fence"], len(opening["indent"]), opening["info"].strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        mark = _MARK.match(before)
        title = _TITLE.search(info)
        found.append(
            Block(
                page=page,
                line=start + 1,
                lang=info.split()[0] if info else "",
                title=title["title"] if title else None,
                mark=mark["kind"] if mark else None,
                argument=(mark["arg"] or None) if mark else None,
                code="\n".join(body) + "\n",
            )
        )
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def block_with(marker: str) -> str:
    """The code of the one Python block, on any page, that contains ``marker``."""
    matches = [b for b in all_blocks() if b.lang == "python" and marker in b.code]
    if len(matches) != 1:
        where = ", ".join(b.where for b in matches) or "no block"
        raise AssertionError(f"{marker!r} must select exactly one Python block of the docs: {where}")
    return matches[0].code


def with_url(code: str, url: str) -> str:
    """The block with the test's Redis in place of the one the docs show."""
    return re.sub(r"redis://localhost:6379(/0)?", url, code)
