"""An honest name and install (issue 11, item 6).

The distribution is ``fencekit-jobs`` (``fencekit`` on PyPI is another
project); the sdist carries every file the README links to; the classifiers
name exactly the Pythons ``.ci/run`` tests; the compiled extension carries
no symbol table. The sdist is built for real with ``python -m build``.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import tomllib

import fencekit._redis._resp as resp

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_fencekit_jobs_and_imports_as_fencekit() -> None:
    meta = importlib.metadata.metadata("fencekit-jobs")
    assert meta["Name"] == "fencekit-jobs"
    top_level = {Path(str(f)).parts[0] for f in importlib.metadata.files("fencekit-jobs") or ()}
    assert "fencekit" in top_level or any(p.endswith(".pth") for p in top_level), top_level
    readme = (ROOT / "README.md").read_text()
    # Not on PyPI yet: the first install line installs the checkout (CI's others-build pass
    # builds that same wheel per Python), and the README says so and names the distribution.
    install = re.search(r"## Install\n.*?```sh\n(.*?)\n", readme, re.DOTALL)
    assert install is not None
    assert install.group(1).split("#")[0].strip() == "pip install ."
    assert "`fencekit-jobs` in place of `.`" in readme
    assert re.search(r"^pip install fencekit", readme, re.MULTILINE) is None


def test_the_classifiers_name_exactly_the_pythons_ci_tests() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = {
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    ci = (ROOT / ".ci" / "run").read_text()
    loop = re.search(r"^for version in ([\d. ]+); do$", ci, re.MULTILINE)
    assert loop is not None
    assert set(loop.group(1).split()) == listed == {"3.10", "3.11", "3.12", "3.13"}
    assert project["requires-python"] == ">=3.10"


def tracked_files(*paths: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", *paths], check=True, capture_output=True, text=True
    )
    return [name for name in out.stdout.split("\0") if name and (ROOT / name).is_file()]


def test_the_sdist_ships_what_the_readme_links_to(tmp_path: Path) -> None:
    # Built from a copy of the tracked files: no stale egg-info can add what MANIFEST.in forgets.
    tree = tmp_path / "tree"
    for name in tracked_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = tmp_path.glob("fencekit_jobs-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    readme = (ROOT / "README.md").read_text()
    linked = {
        target.split("#")[0]
        for target in re.findall(r"\]\(([^)\s]+)\)", readme)
        if not target.startswith(("http://", "https://", "#", "mailto:"))
    }
    assert linked, "the README links to no file"
    for target in sorted(linked):
        assert target.rstrip("/") in names or any(n.startswith(target.rstrip("/") + "/") for n in names), (
            target
        )
    tracked = tracked_files("docs", "contrib", "src/fencekit")
    assert len(tracked) > 50
    missing = sorted(set(tracked) - names)
    assert not missing, missing
    assert not [n for n in names if n.endswith((".so", ".pyc"))]


def test_the_compiled_extension_is_stripped() -> None:
    so = Path(resp.__file__)
    assert so.suffix == ".so", so  # CI installs with FENCEKIT_REQUIRE_EXT=1
    assert b".symtab" not in _section_names(so.read_bytes())


def _section_names(elf: bytes) -> set[bytes]:
    """The section names of a 64-bit little-endian ELF file (enough to see a symbol table)."""
    assert elf[:4] == b"\x7fELF"
    assert (elf[4], elf[5]) == (2, 1)  # 64-bit, little-endian
    shoff = int.from_bytes(elf[0x28:0x30], "little")
    shentsize = int.from_bytes(elf[0x3A:0x3C], "little")
    shnum = int.from_bytes(elf[0x3C:0x3E], "little")
    shstrndx = int.from_bytes(elf[0x3E:0x40], "little")
    headers = [elf[shoff + i * shentsize : shoff + (i + 1) * shentsize] for i in range(shnum)]
    strtab = headers[shstrndx]
    str_off = int.from_bytes(strtab[0x18:0x20], "little")
    names = set()
    for header in headers:
        start = str_off + int.from_bytes(header[0:4], "little")
        names.add(elf[start : elf.index(b"\0", start)])
    return names
