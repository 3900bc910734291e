"""The import graph of a folder of Python, read from the source (imports anywhere, function level too), and its
cycles."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere in its code."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}
    return {module for module in found if module in modules and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def import_graph(folder: str, root: Path = ROOT) -> dict[str, set[str]]:
    paths = sorted((root / folder).rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    # a package's face only hands names on; the arrows that matter run between the modules themselves
    faces = {module_name(p, root) for p in paths if p.name == "__init__.py"}
    return {module_name(p, root): _imports(p, root, modules) - faces for p in paths if p.name != "__init__.py"}
