"""Measure the import graph of engine/, ingest/ and jobs/: circles and upward imports.

Counts every import statement, wherever it stands: module level, inside a function (deferred),
under ``if TYPE_CHECKING:``. ``from a.b import c`` is an import of ``a.b.c`` when that is a
module, else of ``a.b``; a package's ``__init__`` run by importing its submodules is not counted
(import-linter counts the same way). Prints

- the circles: strongly connected components of two or more files, per top package;
- the upward imports inside engine/: an import from a module to one in a higher layer of the
  `layers` contract in pyproject.toml (docs/layers.md), its `ignore_imports` counted too;
- the engine modules ingest/ imports (its engine surface, docs/engine.md: at most
  :data:`INGEST_SURFACE_LIMIT`; the ``forbidden`` contract "ingest imports only the engine's
  surface" enforces the list).

Run: ``.venv/bin/python scripts/import_graph.py`` (``--edges`` also lists each circle's
imports). The contracts in pyproject.toml (``lint-imports``) enforce what this measures.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "ingest", "jobs")
INGEST_SURFACE_LIMIT = 12
"""Engine modules ingest/ may import (issue 35; docs/engine.md, "ingest's engine surface")."""

def contract_layers() -> dict[str, int]:
    """Module (or package) → layer number, 1 lowest, from the `layers` contract of pyproject.toml.

    A layer's modules are separated by ``:`` or ``|`` (siblings of one layer)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = (c["layers"] for c in contracts if c["type"] == "layers")
    found: dict[str, int] = {}
    for number, layer in enumerate(reversed(layers), start=1):
        for name in layer.replace("|", ":").split(":"):
            found[name.strip()] = number
    return found


LAYERS = contract_layers()


def layer_of(module: str) -> int:
    """The layer of an engine module: its own or its nearest package's (0 if in none)."""
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    return 0


def modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement of one file, deferred ones too."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = _resolve(f"{base}.{alias.name}", known) or _resolve(base, known)
                if target:
                    yield target, node.lineno


def graph() -> dict[str, dict[str, int]]:
    """module → {imported module: first line}, self-imports left out."""
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        out = edges.setdefault(module, {})
        for target, line in imports(module, path, known):
            if target != module:
                out.setdefault(target, line)
    return edges


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
    return sorted(found, key=lambda c: (-len(c), c))


def upward(edges: dict[str, dict[str, int]]) -> list[tuple[str, int, str, int, int]]:
    """(importer, its layer, imported, its layer, line) for each upward import in engine/."""
    found = []
    for module, out in sorted(edges.items()):
        low = layer_of(module)
        if not low:
            continue
        for target, line in sorted(out.items()):
            high = layer_of(target)
            if high > low:
                found.append((module, low, target, high, line))
    return found


def ingest_surface(edges: dict[str, dict[str, int]]) -> dict[str, list[str]]:
    """Engine module → the ingest modules importing it (``from engine import x`` counts as
    ``engine.x`` when that is a module)."""
    found: dict[str, list[str]] = {}
    for module, out in sorted(edges.items()):
        if module.split(".")[0] == "ingest":
            for target in out:
                if target.split(".")[0] == "engine":
                    found.setdefault(target, []).append(module)
    return dict(sorted(found.items()))


def main(argv: list[str]) -> int:
    """Print the circles, the upward imports and ingest's engine modules; exit 0 (a
    measurement, not a check) unless ingest imports more than the limit."""
    edges = graph()
    found = circles(edges)
    for package in PACKAGES:
        mine = [c for c in found if c[0].split(".")[0] == package]
        sizes = ", ".join(str(len(c)) for c in mine) or "none"
        print(f"{package}: {len(mine)} circle(s)" + (f" of {sizes} files" if mine else ""))
    crossing = [c for c in found if len({m.split('.')[0] for m in c}) > 1]
    if crossing:
        print(f"circles across packages: {len(crossing)}")
    for component in found:
        print(f"\ncircle of {len(component)}:")
        members = set(component)
        for module in component:
            inside = sorted(t for t in edges[module] if t in members)
            if "--edges" in argv:
                print(f"  {module} -> {', '.join(inside)}")
            else:
                print(f"  {module}")
    ups = upward(edges)
    print(f"\nupward imports in engine/: {len(ups)}")
    for module, low, target, high, line in ups:
        print(f"  {module}:{line} (layer {low}) -> {target} (layer {high})")
    surface = ingest_surface(edges)
    print(f"\nengine modules ingest/ imports: {len(surface)} (at most {INGEST_SURFACE_LIMIT})")
    for target, importers in surface.items():
        print(f"  {target} ({len(importers)} files)")
    return 1 if len(surface) > INGEST_SURFACE_LIMIT else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
