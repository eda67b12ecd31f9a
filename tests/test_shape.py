"""The package's shape: no import cycle inside specdec/ (function-level imports count too)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "specdec"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the specdec modules it imports anywhere, except under `if TYPE_CHECKING:`."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]

        class Visitor(ast.NodeVisitor):
            def visit_If(self, node: ast.If) -> None:
                if "TYPE_CHECKING" in ast.unparse(node.test):
                    for n in node.orelse:
                        self.visit(n)
                else:
                    self.generic_visit(node)

            def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                for m in subs or [target]:
                    if m in mods and m != name:
                        graph[name].add(m)

            def visit_Import(self, node: ast.Import) -> None:
                for a in node.names:
                    if a.name in mods and a.name != name:
                        graph[name].add(a.name)

        Visitor().visit(ast.parse(path.read_text()))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_specdec():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle():
    graph = import_graph()
    graph["specdec.sampler"].add("specdec.engine")  # engine imports the sampler: a circle
    assert any({"specdec.sampler", "specdec.engine"} <= set(c) for c in cycles(graph))
