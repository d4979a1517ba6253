"""The package's shape, checked on its source (issue 19): one-way imports without cycles, no god
object, short files, private names private to their module, pure layers pure.

Every import counts: top level, inside functions and under ``TYPE_CHECKING`` (a package
``__init__`` re-exporting its own children does not). "Private attribute" follows the name: an
attribute ``_x`` that some nbdebug module stores on ``self`` belongs to that module, and no other
module may read or write ``obj._x`` (nbdebug's own attributes are named so that they never collide
with torch's, such as ``tensor._version``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "nbdebug"
FILES = sorted(PKG.rglob("*.py"))
MAX_LINES = 400
#: what each layer may not import (prefixes of module names)
FORBIDDEN = {
    "nbdebug.inspectors": ("nbdebug.widgets", "nbdebug.recorders", "nbdebug.magic", "nbdebug.api"),
    "nbdebug.capture": ("nbdebug.inspectors", "nbdebug.widgets", "nbdebug.recorders", "nbdebug.magic", "nbdebug.api",
                        "nbdebug.views", "nbdebug.exports", "nbdebug.doctor", "nbdebug.distributed",
                        "nbdebug.integrations", "nbdebug.testing", "nbdebug.workbench"),
}


def _modname(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODS = {_modname(p): p for p in FILES}
TREES = {m: ast.parse(p.read_text(), str(p)) for m, p in MODS.items()}


def _imports(m: str) -> list[tuple[int, str, str | None]]:
    """(line, module imported, name imported from it or None) for every import statement of ``m``."""
    out = []
    for node in ast.walk(TREES[m]):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = m.split(".") if MODS[m].name == "__init__.py" else m.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out += [(node.lineno, base, a.name) for a in node.names]
    return [x for x in out if x[1] == "nbdebug" or x[1].startswith("nbdebug.")]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODS}
    for m in MODS:
        for _, base, name in _imports(m):
            target = f"{base}.{name}" if name and f"{base}.{name}" in MODS else (base if base in MODS else None)
            if target is not None and target != m:
                edges[m].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), minus a package ``__init__``
    with its own children only."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in MODS:
        if v not in index:
            visit(v)
    inits = {m for m in MODS if MODS[m].name == "__init__.py"}
    return [c for c in out if not all(any(x == i or x.startswith(i + ".") for i in c if i in inits) for x in c)]


def test_no_import_cycle() -> None:
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    edges = {m: set(v) for m, v in _edges().items()}
    edges["nbdebug.capture.rows"].add("nbdebug.capture.session")  # session imports rows (indirectly)
    assert any("nbdebug.capture.rows" in c for c in _cycles(edges))


def test_capture_is_one_class_of_few_attributes() -> None:
    from nbdebug.capture.session import Capture

    assert Capture.__mro__ == (Capture, object)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = Capture(model)
    with cap:
        assert len(vars(cap)) <= 25, sorted(vars(cap))
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
        assert len(vars(cap)) <= 25, sorted(vars(cap))
    assert len(vars(cap)) <= 25, sorted(vars(cap))


def test_no_long_files() -> None:
    js = sorted((ROOT / "js" / "src").rglob("*.ts")) + sorted((ROOT / "js" / "src").rglob("*.js"))
    long = {str(p.relative_to(ROOT)): n for p in [*FILES, *js] if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_private_name_imported_from_another_module() -> None:
    found = []
    for m in MODS:
        for line, base, name in _imports(m):
            if name and name.startswith("_") and not name.startswith("__") and f"{base}.{name}" not in MODS and base != m:
                found.append(f"{MODS[m].relative_to(ROOT)}:{line} imports {base}.{name}")
    assert found == []


def _owned() -> dict[str, set[str]]:
    """Private attribute name → the modules that store it on ``self``."""
    owned: dict[str, set[str]] = {}
    for m, tree in TREES.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                    and node.value.id == "self" and node.attr.startswith("_") and not node.attr.startswith("__")):
                owned.setdefault(node.attr, set()).add(m)
    return owned


def test_no_private_attribute_reached_from_another_module() -> None:
    owned = _owned()
    found = []
    for m, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in owned and m not in owned[node.attr]:
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                found.append(f"{MODS[m].relative_to(ROOT)}:{node.lineno} .{node.attr} (of {', '.join(sorted(owned[node.attr]))})")
    assert found == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_pure_layers_import_nothing_above_them(layer: str) -> None:
    found = []
    for m in MODS:
        if m != layer and not m.startswith(layer + "."):
            continue
        for line, base, name in _imports(m):
            target = f"{base}.{name}" if name and f"{base}.{name}" in MODS else base
            if any(target == f or target.startswith(f + ".") for f in FORBIDDEN[layer]):
                found.append(f"{MODS[m].relative_to(ROOT)}:{line} imports {target}")
    assert found == []
