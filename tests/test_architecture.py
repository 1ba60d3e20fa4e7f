"""The shape of the code base: no import cycle in engine/ or coop/, one module that loads the
native extension, no Python file too long to read in one sitting.

The module graph is read from the source (ast), so nothing is imported: every `import` and
`from ... import` of the package's own modules counts, at module level and inside functions
alike (an import moved into a function still makes the modules depend on each other). A module
implicitly imports its parent packages; only an explicit import of a package counts as an edge.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
# the one module allowed to import engine._C; everything else reaches native code through it
NATIVE_LOADER = "engine._native"


def module_files(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_target(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The dotted module a `from ... import` statement reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's own modules that `module` imports, anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            target = import_target(module, path, node)
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            found.update(submodules)
            if target in known and len(submodules) < len(node.names):  # a name from the module itself
                found.add(target)
    found.discard(module)
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    files = module_files(package)
    return {module: imported_modules(module, path, set(files)) for module, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", ["engine", "coop"])
def test_no_import_cycle(package):
    found = cycles(import_graph(package))
    assert not found, f"import cycles in {package}/ (each line: modules that import each other): " + \
        "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("package", ["engine", "coop"])
def test_no_python_file_over_the_limit(package):
    long = {str(p.relative_to(ROOT)): n for p in module_files(package).values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by concern): {long}"


def test_one_module_loads_the_native_extension():
    """Only the loader imports engine._C or passes the extension object around under a name of
    its own (`_C`, `_cuda_C`): every other module calls native code through the backend."""
    users = set()
    for package in ("engine", "coop"):
        for module, path in module_files(package).items():
            if module == NATIVE_LOADER:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import) and any(a.name == "engine._C" for a in node.names):
                    users.add(module)
                elif isinstance(node, ast.ImportFrom):
                    target = import_target(module, path, node)
                    names = {a.asname or a.name for a in node.names} | {a.name for a in node.names}
                    if target == "engine._C" or (target == "engine" and "_C" in names) or \
                            any(name == "_C" or name.endswith("_C") for name in names):
                        users.add(module)
                elif isinstance(node, ast.Name) and (node.id == "_C" or node.id.endswith("_C")):
                    users.add(module)
    assert not users, f"modules that reach engine._C directly: {sorted(users)}; only {NATIVE_LOADER} may"
