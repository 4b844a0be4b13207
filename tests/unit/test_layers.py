"""The package's layers: imports point down only, no import cycle, and a light ``import fencekit``.

The import graph is read from the source (every ``import`` and ``from ... import``,
inside functions too; only ``if TYPE_CHECKING:`` blocks are left out), so a lazy
import inside a function cannot hide an upward edge or a cycle. The layer order
is the one ``docs/design.md`` draws; a module may import its own package, any
lower layer, and nothing beside or above it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

import fencekit

SRC = Path(fencekit.__file__).parent

LAYERS: list[list[str]] = [  # bottom first; names are packages or modules below ``fencekit``
    ["errors"],
    ["_options", "_compat", "_log", "_coverage", "hooks", "_aio"],
    ["_redis"],
    ["primitives", "jobs"],
    ["settings", "compiled"],
    ["produce"],
    ["consume"],
    ["services"],
    ["web"],
    ["runtime"],
    ["pool"],
    ["integrations", "testing", "upgrade", "demo"],
    [""],  # fencekit itself: the facade
    ["cli"],
    ["__main__"],
]
"""The layer order (docs/design.md, "Layers"). Siblings in one layer do not import each other."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def graph() -> dict[str, set[str]]:
    """Module -> the fencekit modules it imports (resolved to the deepest module that exists)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        hidden = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target == "fencekit" or target.startswith("fencekit."):
                    found = resolve(target)
                    if found and found != name:
                        edges[name].add(found)
    for name in modules:
        edges.setdefault(name, set())
    return dict(edges)


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the layer entry) of a ``fencekit...`` module."""
    rest = module[len("fencekit.") :] if module != "fencekit" else ""
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if rest == entry or (entry and rest.startswith(entry + ".")):
                return index, entry
    raise AssertionError(f"{module} is in no layer of LAYERS: add it there and to docs/design.md")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking_blocks() -> None:
    edges = graph()
    # fencekit/__init__.py imports the pool only inside its module __getattr__ ...
    assert "fencekit.pool" in edges["fencekit"]
    # ... and fencekit.hooks names BeginOutcome only for the type checker.
    assert "fencekit.primitives.tokens" not in edges["fencekit.hooks"]
    assert "fencekit.errors" in edges["fencekit._redis.run"]


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_in_a_layer() -> None:
    for module in graph():
        layer_of(module)


def test_imports_point_down_only() -> None:
    upward = []
    for module, targets in graph().items():
        here, entry = layer_of(module)
        for target in targets:
            there, other = layer_of(target)
            if there > here or (there == here and other != entry and module != "fencekit"):
                upward.append(f"{module} (layer {here}) imports {target} (layer {there})")
    assert upward == [], "\n".join(sorted(upward))


def test_an_upward_import_is_caught() -> None:
    here, _ = layer_of("fencekit.jobs.codec")
    there, _ = layer_of("fencekit.consume._consumer")
    assert there > here
    assert layer_of("fencekit.primitives.lock")[1] != layer_of("fencekit.jobs.task")[1]


def test_import_fencekit_loads_no_pool_cli_or_argparse() -> None:
    """``import fencekit`` is what a web process that only enqueues pays: no pool, no CLI, no argparse."""
    code = (
        "import sys, fencekit\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('fencekit', 'argparse')))))\n"
        "fencekit.Pool\n"  # still importable, on first use
        "print('after:', 'fencekit.pool' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "COV_CORE_SOURCE"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, timeout=60
    ).stdout.splitlines()
    loaded = set(out[:-1])
    heavy = {m for m in loaded if m.startswith(("fencekit.pool", "fencekit.cli", "argparse"))}
    assert heavy == set(), heavy
    assert "fencekit.produce.client" in loaded
    assert out[-1] == "after: True"


MAX_MODULES_PER_FOLDER = 16
MAX_MODULE_LINES = 420  # "about 400": a module past it has more than one job


def test_no_folder_holds_more_than_16_modules() -> None:
    crowded = {
        str(folder.relative_to(SRC.parent)): count
        for folder in [SRC, *(p for p in SRC.rglob("*") if p.is_dir() and p.name != "__pycache__")]
        if (count := len(list(folder.glob("*.py")))) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_no_module_is_much_over_400_lines() -> None:
    long = {
        str(path.relative_to(SRC.parent)): lines
        for path in SRC.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
