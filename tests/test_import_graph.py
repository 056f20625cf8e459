"""The package's import graph has no cycle: every import statement counts, at the top of a module
or inside a function (a lazy import still ties two modules together), `TYPE_CHECKING` ones too;
and the biLM's description, its weight readers and the model import in that order."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spacy_elmo"


def _modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a submodule named in `from pkg import sub`
    is the edge, not the package)."""
    modules = _modules()
    graph = {}
    for name, (path, is_init) in modules.items():
        package = name if is_init else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = [f"{target}.{a.name}" for a in node.names]
                named = [m for m in submodules if m in modules]
                edges.update(named)
                if target in modules and len(named) < len(submodules):
                    edges.add(target)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


# The order of the layers around the biLM, bottom first: the description of a biLM (its options
# and character ids), the weight readers, the model. A layer imports only those below it.
LAYERS = ("spacy_elmo.description", "spacy_elmo.weights", "spacy_elmo.bilm")


def layer(module: str) -> int | None:
    for index, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            return index
    return None


def test_the_description_readers_and_model_import_in_one_order():
    graph = import_graph()
    for name, edges in graph.items():
        here = layer(name)
        if here is None:
            continue
        for edge in edges:
            there = layer(edge)
            assert there is None or there <= here, (name, edge)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the packages it imports."""

    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    packages: dict[str, set[str]] = {}
    for name, edges in graph.items():
        packages.setdefault(package(name), set()).update(package(e) for e in edges)
    return {name: edges - {name} for name, edges in packages.items()}


def test_no_cycle_between_packages():
    assert cycles(package_graph(import_graph())) == []
    loop = {
        "spacy_elmo.weights.layouts": {"spacy_elmo.bilm.model"},
        "spacy_elmo.bilm.model": {"spacy_elmo.weights.layouts"},
    }
    assert cycles(package_graph(loop)) == [["bilm", "weights"]]


def test_the_model_reads_no_weights_but_through_its_loading_module():
    """The biLM's maths imports no weight reader: `bilm/loading.py`, the constructors and
    writers that `BiLM` inherits, is the one module of bilm/ above the readers."""
    graph = import_graph()
    for name, edges in graph.items():
        if name.startswith("spacy_elmo.bilm") and name != "spacy_elmo.bilm.loading":
            assert not {e for e in edges if e.startswith("spacy_elmo.weights")}, name
