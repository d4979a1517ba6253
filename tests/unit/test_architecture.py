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
import functools
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "nbdebug"
FILES = sorted(PKG.rglob("*.py"))
MAX_LINES = 400
_ABOVE_RUNS = ("nbdebug.inspectors", "nbdebug.sessions", "nbdebug.cams", "nbdebug.widgets", "nbdebug.recorders", "nbdebug.magic", "nbdebug.api",
               "nbdebug.views", "nbdebug.exports", "nbdebug.doctor", "nbdebug.distributed", "nbdebug.integrations",
               "nbdebug.testing", "nbdebug.workbench", "nbdebug.attribution")
#: what each layer may not import (prefixes of module names): capture ← adapters ← runs ← workbench, attribution…
FORBIDDEN = {
    "nbdebug.inspectors": ("nbdebug.widgets", "nbdebug.recorders", "nbdebug.magic", "nbdebug.api"),
    "nbdebug.capture": (*_ABOVE_RUNS, "nbdebug.runs"),
    "nbdebug.runs": _ABOVE_RUNS,
    "nbdebug.cams": ("nbdebug.sessions", "nbdebug.recorders", "nbdebug.widgets", "nbdebug.magic", "nbdebug.api", "nbdebug.views"),
    "nbdebug.sessions": ("nbdebug.recorders", "nbdebug.widgets", "nbdebug.magic", "nbdebug.api", "nbdebug.views"),
}
#: the hygiene primitives and who may call them: the hygiene module and the one own pass (issue 28)
OWN_PASS_ONLY = {"preserve_buffers", "suspend_hooks"}
OWN_PASS_CALLERS = {"nbdebug.capture.state", "nbdebug.runs.own"}


def _modname(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODS = {_modname(p): p for p in FILES}
TREES = {m: ast.parse(p.read_text(), str(p)) for m, p in MODS.items()}


@functools.cache
def _nodes(tree: ast.AST) -> tuple[ast.AST, ...]:
    """``ast.walk(tree)``, walked once per tree: the scanners below read every node of the package's ~150
    modules (~0.4 CPU-s a pass) in each of ~20 tests. Planted trees are walked the same way."""
    return tuple(ast.walk(tree))


def _imports(m: str) -> list[tuple[int, str, str | None]]:
    """(line, module imported, name imported from it or None) for every import statement of ``m``."""
    out = []
    for node in _nodes(TREES[m]):
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


def _long(paths: list[Path]) -> dict[str, int]:
    return {p.name if not p.is_relative_to(ROOT) else str(p.relative_to(ROOT)): n
            for p in paths if (n := len(p.read_text().splitlines())) > MAX_LINES}


def test_no_long_files() -> None:
    js = sorted((ROOT / "js" / "src").rglob("*.ts")) + sorted((ROOT / "js" / "src").rglob("*.js"))
    assert _long([*FILES, *js]) == {}


def _private_imports(imports: dict[str, list[tuple[int, str, str | None]]]) -> list[str]:
    found = []
    for m, rows in imports.items():
        for line, base, name in rows:
            if name and name.startswith("_") and not name.startswith("__") and f"{base}.{name}" not in MODS and base != m:
                found.append(f"{m}:{line} imports {base}.{name}")
    return found


def test_no_private_name_imported_from_another_module() -> None:
    assert _private_imports({m: _imports(m) for m in MODS}) == []


def _owned() -> dict[str, set[str]]:
    """Private attribute name → the modules that store it on ``self``."""
    owned: dict[str, set[str]] = {}
    for m, tree in TREES.items():
        for node in _nodes(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                    and node.value.id == "self" and node.attr.startswith("_") and not node.attr.startswith("__")):
                owned.setdefault(node.attr, set()).add(m)
    return owned


def _private_reach(trees: dict[str, ast.AST], owned: dict[str, set[str]]) -> list[str]:
    found = []
    for m, tree in trees.items():
        for node in _nodes(tree):
            if isinstance(node, ast.Attribute) and node.attr in owned and m not in owned[node.attr]:
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                found.append(f"{m}:{node.lineno} .{node.attr} (of {', '.join(sorted(owned[node.attr]))})")
    return found


def test_no_private_attribute_reached_from_another_module() -> None:
    assert _private_reach(TREES, _owned()) == []


def _layer_violations(layer: str, imports: dict[str, list[tuple[int, str, str | None]]]) -> list[str]:
    found = []
    for m, rows in imports.items():
        if m != layer and not m.startswith(layer + "."):
            continue
        for line, base, name in rows:
            target = f"{base}.{name}" if name and f"{base}.{name}" in MODS else base
            if any(target == f or target.startswith(f + ".") for f in FORBIDDEN[layer]):
                found.append(f"{m}:{line} imports {target}")
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_pure_layers_import_nothing_above_them(layer: str) -> None:
    assert _layer_violations(layer, {m: _imports(m) for m in MODS}) == []


@pytest.mark.parametrize(("layer", "planted"), [("nbdebug.runs", "nbdebug.workbench.session"),
                                               ("nbdebug.runs", "nbdebug.sessions.ablation"),
                                               ("nbdebug.sessions", "nbdebug.recorders.attention"),
                                               ("nbdebug.sessions", "nbdebug.widgets.attention"),
                                               ("nbdebug.cams", "nbdebug.sessions.gradcam"),
                                               ("nbdebug.runs", "nbdebug.attribution.tokens"),
                                               ("nbdebug.capture", "nbdebug.runs.own"),
                                               ("nbdebug.inspectors", "nbdebug.widgets._base")])
def test_the_layer_rule_finds_a_planted_import(layer: str, planted: str) -> None:
    imports = {m: _imports(m) for m in MODS}
    imports[f"{layer}.planted"] = [(1, planted, None)]
    assert _layer_violations(layer, imports) == [f"{layer}.planted:1 imports {planted}"]



def _hygiene_calls(trees: dict[str, ast.AST]) -> dict[str, list[int]]:
    """Module → lines calling ``preserve_buffers``/``suspend_hooks`` (by name or attribute)."""
    out: dict[str, list[int]] = {}
    for m, tree in trees.items():
        for node in _nodes(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in OWN_PASS_ONLY:
                    out.setdefault(m, []).append(node.lineno)
    return out


def _own_pass_violations(trees: dict[str, ast.AST]) -> list[str]:
    allowed = OWN_PASS_CALLERS
    return [f"{m}:{lines}" for m, lines in sorted(_hygiene_calls(trees).items()) if m not in allowed]


def test_buffers_and_hooks_are_set_aside_only_by_the_one_own_pass() -> None:
    assert _own_pass_violations(TREES) == []
    assert set(_hygiene_calls(TREES)) <= OWN_PASS_CALLERS
    assert "nbdebug.runs.own" in _hygiene_calls(TREES)


def test_the_own_pass_scan_finds_a_planted_call() -> None:
    trees = dict(TREES)
    trees["nbdebug.workbench.planted"] = ast.parse("from nbdebug.capture import state\n"
                                                   "with torch.no_grad(), state.preserve_buffers(m):\n    m(x)\n")
    trees["nbdebug.runs.planted"] = ast.parse("with suspend_hooks(m):\n    pass\n")
    assert _own_pass_violations(trees) == ["nbdebug.runs.planted:[1]", "nbdebug.workbench.planted:[2]"]


def test_the_other_scanners_find_planted_mistakes(tmp_path: Path) -> None:
    imports = {m: _imports(m) for m in MODS}
    imports["nbdebug.workbench.planted"] = [(3, "nbdebug.runs.replay", "_GROUPS")]
    assert _private_imports(imports) == ["nbdebug.workbench.planted:3 imports nbdebug.runs.replay._GROUPS"]
    trees = dict(TREES)
    trees["nbdebug.workbench.planted"] = ast.parse("def f(r):\n    return r._kwargs\n")
    planted = [f for f in _private_reach(trees, _owned()) if "planted" in f]
    assert len(planted) == 1 and planted[0].startswith("nbdebug.workbench.planted:2 ._kwargs (of ") and "runs.replay" in planted[0]
    long_file = tmp_path / "planted.py"
    long_file.write_text("x = 1\n" * (MAX_LINES + 1))
    assert _long([*FILES, long_file]) == {"planted.py": MAX_LINES + 1}


#: the one helper recorders/ may hold beside one file per registered view
RECORDER_HELPERS = {"__init__", "_language"}


def _recorder_files_not_views(stems: set[str]) -> list[str]:
    from nbdebug.views import VIEWS

    views = {spec.recorder.partition(":")[0].rsplit(".", 1)[-1] for spec in VIEWS.values()}
    return sorted((stems - views - RECORDER_HELPERS) | (views - stems))


def test_recorders_are_exactly_the_registered_views() -> None:
    from nbdebug.views import VIEWS

    assert all(spec.recorder.startswith(f"nbdebug.recorders.{name}:") for name, spec in VIEWS.items())
    assert _recorder_files_not_views({p.stem for p in (PKG / "recorders").glob("*.py")}) == []


def test_the_recorders_scan_finds_a_planted_session() -> None:
    stems = {p.stem for p in (PKG / "recorders").glob("*.py")}
    assert _recorder_files_not_views(stems | {"ablation_session"}) == ["ablation_session"]
    assert _recorder_files_not_views(stems - {"patching"}) == ["patching"]


def _protocol_mismatches(cls: type, proto: type) -> list[str]:
    """Members of ``proto`` that ``cls`` lacks or defines with other parameters."""
    import inspect

    out = []
    for name in sorted(set(inspect.get_annotations(proto)) | {k for k, v in vars(proto).items()
                                                              if (callable(v) or isinstance(v, property)) and not k.startswith("_")}):
        want = inspect.getattr_static(proto, name, None)
        have = inspect.getattr_static(cls, name, None)
        if callable(want):
            if not callable(have) or list(inspect.signature(have).parameters) != list(inspect.signature(want).parameters):
                out.append(name)
        elif isinstance(want, property):
            if not isinstance(have, property):
                out.append(name)
        elif have is None and name not in _instance_attributes(cls):  # a data member: set on the class or on self
            out.append(name)
    return out


def _instance_attributes(cls: type) -> set[str]:
    """Names a class (or a base) annotates, defines, or assigns as ``self.name`` in one of its methods."""
    import inspect
    import textwrap

    names: set[str] = set()
    for k in cls.__mro__:
        if k is object:
            continue
        names |= set(inspect.get_annotations(k)) | set(vars(k))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            target = node.target if isinstance(node, ast.AnnAssign) else None
            targets = [target] if target is not None else node.targets if isinstance(node, ast.Assign) else []
            while any(isinstance(t, (ast.Tuple, ast.List)) for t in targets):  # a, self.b = …
                targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def _sessions() -> list[tuple[type, type]]:
    from nbdebug.sessions import protocols as p
    from nbdebug.sessions.ablation import AblationSession
    from nbdebug.sessions.attribution import AttributionSession
    from nbdebug.sessions.channels import ChannelAblation
    from nbdebug.sessions.gradcam import GradCamSession
    from nbdebug.sessions.patching import PatchSession
    from nbdebug.sessions.steer import SteerLens
    from nbdebug.sessions.thermometer import ModuleAblation

    return [(AblationSession, p.Ablates), (ChannelAblation, p.Ablates), (ModuleAblation, p.Ablates),
            (PatchSession, p.PatchClicks), (SteerLens, p.SteerClicks), (GradCamSession, p.CamClicks),
            (AttributionSession, p.AttributionClicks)]


@pytest.mark.parametrize("pair", _sessions(), ids=lambda pair: pair[0].__name__)
def test_each_session_has_what_its_widget_protocol_asks(pair: tuple[type, type]) -> None:
    assert _protocol_mismatches(*pair) == []


def test_the_protocol_check_finds_a_planted_mismatch() -> None:
    from nbdebug.sessions.protocols import Ablates, CamClicks

    class Positional:
        def respond(self, layer: str, channels: list[int], mode: str = "zero") -> dict:  # a kind's own shape
            return {}

    class OneRequest:
        def respond(self, request: dict) -> tuple:
            return {}, {}

    assert _protocol_mismatches(Positional, Ablates) == ["respond"]
    assert _protocol_mismatches(OneRequest, Ablates) == []
    assert _protocol_mismatches(object, Ablates) == ["respond"]
    assert _protocol_mismatches(OneRequest, CamClicks) == ["maps_for"]


def test_the_protocol_check_finds_a_missing_data_member() -> None:
    """A session with the methods but not the attributes a widget reads (review S1: was unchecked)."""
    from nbdebug.sessions.patching import PatchSession
    from nbdebug.sessions.protocols import PatchClicks, SteerClicks

    class Half:
        def grid(self, sites: str = "resid", method: str = "exact") -> None: ...

        def cell(self, sites: str, method: str, row: int, col: int, k: int = 5) -> None: ...

    class Full(Half):
        metric_label = "m"

        def __init__(self) -> None:
            self.metric_clean = self.metric_corrupt = 0.0
            self.tokens_clean: list[str] = []
            self.tokens_corrupt, self.top_clean, self.top_corrupt = [], [], []

    assert _protocol_mismatches(Half, PatchClicks) == ["metric_clean", "metric_corrupt", "metric_label", "tokens_clean",
                                                       "tokens_corrupt", "top_clean", "top_corrupt"]
    assert _protocol_mismatches(Full, PatchClicks) == []
    assert _protocol_mismatches(PatchSession, PatchClicks) == []
    assert "runs" in _protocol_mismatches(Half, SteerClicks)


#: the click sessions' float64 is made on the CPU (review S3: ``.double()`` on a device tensor fails on MPS)
def _device_float64(text: str) -> list[int]:
    """Lines where ``.double()`` comes without a ``.cpu()`` before it on the line (``# cpu:`` says why not)."""
    return [i for i, line in enumerate(text.splitlines(), 1)
            if ".double()" in line and "# cpu:" not in line and ".cpu()" not in line.split(".double()")[0]]


def test_sessions_make_float64_on_the_cpu_only() -> None:
    found = {f.name: _device_float64(f.read_text()) for f in sorted((PKG / "sessions").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
    assert _device_float64("p = logits.detach().double().cpu()\nq = x.cpu().double()\nr = m.double()  # cpu: measured") == [1]


def test_widgets_type_their_session_by_a_protocol() -> None:
    """No widget takes its click session as ``Any``."""
    sessions = {"ablation", "session", "steering"}
    found = []
    for m, tree in TREES.items():
        if not m.startswith("nbdebug.widgets."):
            continue
        for node in _nodes(tree):
            if isinstance(node, (ast.arg, ast.AnnAssign)):
                name = node.arg if isinstance(node, ast.arg) else getattr(node.target, "id", None)
                ann = node.annotation
                if name in sessions and ann is not None and "Any" in ast.unparse(ann):
                    found.append(f"{m}:{node.lineno} {name}")
    assert found == []


def _unmapped(arch: str, files: list[Path]) -> list[str]:
    """Modules ARCHITECTURE.md does not name (a file as `folder/file.py`, a package by its `folder/`), and
    folders its diagram (the first code block) leaves out."""
    diagram = arch.split("```")[1]
    out = []
    for p in files:
        rel = p.relative_to(PKG)
        name = "__init__.py" if rel.as_posix() == "__init__.py" else \
            f"{rel.parent.as_posix()}/" if p.name == "__init__.py" else rel.as_posix()
        if f"`{name}" not in arch:
            out.append(name)
    folders = sorted({p.relative_to(PKG).parts[0] for p in files if len(p.relative_to(PKG).parts) > 1})
    return out + [f"diagram: {f}/" for f in folders if f"{f}/" not in diagram]


def test_architecture_md_maps_every_module_and_folder() -> None:
    assert _unmapped((ROOT / "ARCHITECTURE.md").read_text(), FILES) == []


def test_the_map_check_finds_a_planted_module() -> None:
    arch = (ROOT / "ARCHITECTURE.md").read_text()
    planted = PKG / "sessions" / "planted.py"
    assert _unmapped(arch, [*FILES, planted]) == ["sessions/planted.py"]
    diagram = arch.split("```")[1]
    assert _unmapped(arch.replace(diagram, diagram.replace("sessions/", "sessions")), FILES) == ["diagram: sessions/"]
