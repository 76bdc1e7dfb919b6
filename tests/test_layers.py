"""The package's folders are layers (docs/ARCHITECTURE.md): a module imports only from its
own layer or the ones below it, and no two packages import each other in a cycle.

Every import counts: module level, inside functions, under TYPE_CHECKING.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cortiq

SRC = Path(cortiq.__file__).resolve().parent

# Bottom to top. A module belongs to the longest prefix listed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("cortiq.errors", "cortiq.types", "cortiq.demo")),
    ("kernels", ("cortiq.kernels",)),
    ("cmf", ("cortiq.cmf",)),
    ("models", ("cortiq.models",)),
    # GGUF files as models: the Llama family's names come from the models' registry
    ("gguf", ("cortiq.gguf",)),
    ("convert", ("cortiq.convert", "cortiq.pretrained", "cortiq.hub", "cortiq.model_cache")),
    ("gpu", ("cortiq.gpu",)),
    ("text", ("cortiq.text",)),
    ("runtime", ("cortiq.runtime",)),
    ("serve", ("cortiq.serve", "cortiq.server", "cortiq.ray")),
    ("package", ()),  # cortiq/__init__ and __main__: the public names, `python -m cortiq`
]
PACKAGE_MODULES = ("cortiq", "cortiq.__main__")
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def layer_of(module: str) -> str:
    if module in PACKAGE_MODULES:
        return "package"
    best, found = -1, None
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), name
    if found is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")
    return found


def package_of(module: str) -> str:
    """The top-level unit a module belongs to: cortiq.<first part>, or cortiq itself."""
    parts = module.split(".")
    return "cortiq" if module in PACKAGE_MODULES else ".".join(parts[:2])


def modules(root: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = p
    for p in root.rglob("*.pyx"):
        out[".".join(p.relative_to(root.parent).with_suffix("").parts)] = p
    return out


def import_edges(mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(importer, imported module, line) for every cortiq import of every module."""
    edges = []
    for name, path in mods.items():
        if path.suffix != ".py":
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from pkg import sub` imports the submodule pkg.sub
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [target, *subs]
            else:
                continue
            for t in targets:
                if t == "cortiq" or t.startswith("cortiq."):
                    edges.append((name, t, node.lineno))
    return edges


def upward(edges) -> list[str]:
    """Every import from a layer to a higher one, as 'importer:line -> imported'."""
    return [f"{src}:{line} ({layer_of(src)}) -> {dst} ({layer_of(dst)})"
            for src, dst, line in edges if RANK[layer_of(dst)] > RANK[layer_of(src)]]


def package_cycles(edges) -> list[list[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        a, b = package_of(src), package_of(dst)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def edges():
    return import_edges(modules())


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)  # raises naming the module


def test_no_import_reaches_a_higher_layer(edges):
    assert edges, "no imports found: the scan is broken"
    assert upward(edges) == []


def test_no_import_cycle_between_packages(edges):
    assert package_cycles(edges) == []


def test_checker_finds_a_planted_violation(tmp_path):
    """The checks fail on a tree that breaks them (a copy with an upward import)."""
    pkg = tmp_path / "cortiq"
    for sub in ("kernels", "cmf"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "tensor.py").write_text("def f():\n    from ..cmf import quant\n")
    (pkg / "cmf" / "quant.py").write_text("from ..kernels import tensor\n")
    found = import_edges(modules(pkg))
    assert ("cortiq.kernels.tensor", "cortiq.cmf.quant", 2) in found
    assert [v.split(" ->")[0] for v in upward(found)] == ["cortiq.kernels.tensor:2 (kernels)"]
    assert package_cycles(found) == [["cortiq.cmf", "cortiq.kernels"]]


def test_unknown_module_is_named():
    with pytest.raises(AssertionError, match="cortiq.extra belongs to no layer"):
        layer_of("cortiq.extra")
