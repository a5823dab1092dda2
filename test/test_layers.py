"""The package's layers point down only (the table of ``docs/design.md``).

Every import of the package -- at the top of a module or inside a function -- is read
with :mod:`ast`; a unit (a top-level module or a subpackage) may import only units of
layers below its own, so the units form no cycle.  The layers below ``ros`` import no
ROS package.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "adaptive_dynamics"
DESIGN = ROOT / "docs" / "design.md"
#: what a ROS-free layer may not import (``ament_index_python``, a file lookup that
#: ``robots`` tries in a colcon install, is not ROS at run time)
ROS_MODULES = re.compile(r"^(rclpy|rcl_interfaces|launch|launch_ros|lifecycle_msgs|builtin_interfaces"
                         r"|[a-z0-9_]+_(msgs|srvs))(\.|$)")


def layers() -> dict[str, int]:
    """unit -> layer, from the table under ``## Layers`` in docs/design.md."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|", section, flags=re.M):
        for unit in re.findall(r"`([a-z_]+)`", m.group(2)):
            out[unit] = int(m.group(1))
    return out


def unit_of(module: str) -> str:
    """``adaptive_dynamics.dynamics.model`` -> ``dynamics``; ``adaptive_dynamics.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


@functools.lru_cache(maxsize=None)
def _parsed(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, its relative dots resolved in ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports() -> list[tuple[str, str, str, int]]:
    """(importing unit, imported module, file, line) for every import in the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        if path.name == "__init__.py":
            module = package = module[: -len(".__init__")]
        tree = _parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                out.append((unit_of(module), name, str(path.relative_to(ROOT)), node.lineno))
    return out


def test_every_unit_has_a_layer():
    units = {unit_of(".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")
             if p.parent != PACKAGE or p.name != "__init__.py"}   # the package's __init__: its version only
    table = layers()
    assert units - set(table) == set(), "place these in docs/design.md's layer table"
    assert set(table) - units == set(), "the layer table names units that do not exist"


def test_imports_point_down_only():
    table = layers()
    wrong = []
    for unit, name, where, line in imports():
        if not name.startswith("adaptive_dynamics.") or unit == "adaptive_dynamics":
            continue
        target = unit_of(name)
        if target == unit:
            continue
        if table[target] >= table[unit]:
            wrong.append(f"{where}:{line}: {unit} (layer {table[unit]}) imports {name} (layer {table[target]})")
    assert not wrong, "\n".join(wrong)


def test_layers_below_ros_import_no_ros():
    table = layers()
    ros = table["ros"]
    wrong = [f"{where}:{line}: {name}" for unit, name, where, line in imports()
             if unit in table and table[unit] < ros and ROS_MODULES.match(name)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("edge", [("dynamics", "control"), ("robots", "dynamics"), ("learning", "control")])
def test_the_check_sees_an_upward_import(tmp_path, edge, monkeypatch):
    """The checker itself: an upward import written into a copy of a module is found."""
    low, high = edge
    table = layers()
    assert table[low] < table[high]
    src = next(p for p in sorted(PACKAGE.rglob("*.py")) if unit_of(".".join(p.relative_to(ROOT).with_suffix("").parts)) == low)
    fake_root = tmp_path
    fake_pkg = fake_root / "adaptive_dynamics"
    dest = fake_pkg / src.relative_to(PACKAGE)
    dest.parent.mkdir(parents=True)
    depth = len(src.relative_to(PACKAGE).parts)   # 1: a top-level module, 2: in a subpackage
    dest.write_text(f"def f():\n    from {'.' * depth}{high} import something\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake_pkg)
    assert (low, f"adaptive_dynamics.{high}") in [(u, n) for u, n, _, _ in imports()]
    with pytest.raises(AssertionError, match=f"{low} .layer {table[low]}. imports adaptive_dynamics.{high}"):
        test_imports_point_down_only()


def test_package_imports_sit_at_the_top_or_say_why_not():
    """A package import inside a function hides a tie from a reader: it is allowed only
    with a comment on its line saying why it is lazy (start-up time, a ROS-free module)."""
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(_parsed(path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and (sub.level or (sub.module or "").startswith("adaptive_dynamics")):
                    if "#" not in "".join(lines[sub.lineno - 1: sub.end_lineno]):
                        hidden.append(f"{path.relative_to(ROOT)}:{sub.lineno}")
    assert not hidden, "move to the module's top, or say why it is lazy: " + ", ".join(sorted(set(hidden)))


def _module_graph() -> dict[str, set[str]]:
    """module -> the package modules its top-level imports load (``from X import y``
    loads X, and X.y when that is a module)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in _parsed(path).body:
            if isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                cands = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            for c in cands:
                while c and c not in modules and "." in c:
                    c = c.rsplit(".", 1)[0]
                if c in modules and c != name and not name.startswith(c + "."):   # (its own packages: begun)
                    deps.add(c)
                    parent = c   # importing a.b.c runs a/__init__ and a/b/__init__ first
                    while "." in parent:
                        parent = parent.rsplit(".", 1)[0]
                        if parent in modules and parent != name and not name.startswith(parent + "."):
                            deps.add(parent)
        graph[name] = deps
    return graph


def test_no_import_cycle_between_modules():
    """No cycle among the package's modules through their top-level imports: every
    module imports on its own, whichever is imported first."""
    graph = _module_graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def strong(v):   # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    assert not cycles, cycles
