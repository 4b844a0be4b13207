"""Every code block of the README and the docs site is accounted for (tests/docs_blocks.py).

A Python block is run as a script by ``test_docs_pages.py``, or selected by the test file its
``tested:`` mark names, or marked as an excerpt; any other block is a shell session or
output, or marked as an excerpt. A new block that nothing runs fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.docs_blocks import OUTPUT, ROOT, SHELL, Block, all_blocks, blocks, pages


def markers_used_by(test_file: Path) -> list[str]:
    """The literal strings a test file passes to ``block_with``."""
    tree = ast.parse(test_file.read_text())
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "block_with"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(node.args[0].value)
    return found


@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: b.where)
def test_every_block_is_run_or_marked(block: Block):
    if block.mark == "excerpt":
        return
    if block.lang in SHELL or block.lang in OUTPUT:
        assert block.mark is None, f"{block.where}: a {block.lang} block is never run; drop its mark"
        return
    assert block.lang == "python", (
        f"{block.where}: a {block.lang or 'plain'} block: mark it <!-- excerpt --> or make it a Python "
        f"block the suite runs, a shell session ({', '.join(sorted(SHELL))}) or output (text)"
    )
    compile(block.code, block.where, "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
    if block.mark == "tested":
        assert block.argument, f"{block.where}: <!-- tested: tests/.../test_x.py --> names the test file"
        test_file = ROOT / block.argument
        assert test_file.is_file(), f"{block.where}: {block.argument} does not exist"
        selecting = [m for m in markers_used_by(test_file) if m in block.code]
        assert selecting, f"{block.where}: {block.argument} has no block_with(...) that selects this block"
    elif block.mark == "serve":
        assert block.argument, f"{block.where}: <!-- serve: module:app -->"
        assert ":" in block.argument, f"{block.where}: <!-- serve: module:app -->"
        titled = {b.title for b in blocks(block.page) if b.title}
        module = block.argument.split(":")[0]
        assert f"{module}.py" in titled, f"{block.where}: no block titled {module}.py on this page to serve"


def test_the_markers_of_the_tests_each_select_one_block():
    """A ``block_with`` marker that matches two blocks (or none) would test the wrong one."""
    python = [b for b in all_blocks() if b.lang == "python"]
    for test_file in sorted((ROOT / "tests").rglob("test_*.py")):
        for marker in markers_used_by(test_file):
            matching = [b.where for b in python if marker in b.code]
            assert len(matching) == 1, f"{test_file.name}: block_with({marker!r}) selects {matching}"


def test_the_site_has_its_pages():
    """The README and the pages are read (a wrong folder would make every check above vacuous)."""
    assert len(pages()) > 10
    assert sum(1 for b in all_blocks() if b.lang == "python" and b.mark is None and not b.title) > 5
