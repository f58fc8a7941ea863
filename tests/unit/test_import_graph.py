"""What import-linter (pyproject's `[tool.importlinter]`, run by `tox -e lint`) cannot say:
no import circle anywhere, among kspout's modules nor among the parts of any package (its
modules and subpackages, each subpackage standing for everything under it), and the
driver-executor contract reaching no third-party library at all. The one-way rules between
named parts are import-linter's contracts.

The graph is read from the source with `ast`, imports under `TYPE_CHECKING` included: a
circle that only the type checker follows is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import kspout

ROOT = Path(kspout.__file__).parent

Graph = dict[str, set[str]]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def libraries(path: Path) -> set[str]:
    """The top-level names of what `path` imports from outside the standard library."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "kspout"}


def imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The kspout modules that `name`'s source imports (`from p import m` names module p.m
    when there is one, else p)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if base not in known:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in known else base


def module_graph() -> Graph:
    found = modules()
    known = set(found)
    return {name: set(imported(name, path, known)) - {name} for name, path in found.items()}


def package_graph(graph: Graph, package: str) -> Graph:
    """The graph among `package`'s direct parts, each standing for everything under it."""
    prefix = package + "."

    def part(name: str) -> str | None:
        if not name.startswith(prefix):
            return None
        return prefix + name[len(prefix) :].split(".")[0]

    out: Graph = {}
    for name, targets in graph.items():
        source = part(name)
        if source is None:
            continue
        out.setdefault(source, set())
        for target in targets:
            other = part(target)
            if other is not None and other != source:
                out[source].add(other)
    return out


def find_cycle(graph: Graph) -> list[str] | None:
    """One circle of `graph` (its nodes in order, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                found = visit(target)
                if found is not None:
                    return found
        on_path.discard(path.pop())
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            found = visit(node)
            if found is not None:
                return found
    return None


def reachable(graph: Graph, start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def packages() -> list[str]:
    return sorted(name for name, path in modules().items() if path.name == "__init__.py")


def test_the_checker_finds_a_circle_and_passes_a_line() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    graph = {"p.x.one": {"p.y"}, "p.y": {"p.x.two"}, "p.x.two": set()}
    assert package_graph(graph, "p") == {"p.x": {"p.y"}, "p.y": {"p.x"}}


def test_the_graph_sees_the_contract_under_both_channel_and_executor() -> None:
    graph = module_graph()
    assert "kspout.contract" in graph["kspout.channel.reporter"]
    assert "kspout.contract" in graph["kspout.executor.task"]


def test_the_contract_reaches_no_library_at_all() -> None:
    """Only the standard library and kspout's pure modules: import-linter forbids named
    packages (pyproject: the contract below both sides, the pure core without client
    libraries); this holds for every library, named or not."""
    graph = module_graph()
    found = modules()
    reached = reachable(graph, "kspout.contract") | {"kspout.contract"}
    assert {m: libraries(found[m]) for m in reached if libraries(found[m])} == {}


def test_no_module_imports_itself_back() -> None:
    assert find_cycle(module_graph()) is None


def test_no_package_has_parts_that_import_each_other_back() -> None:
    graph = module_graph()
    circles = {p: find_cycle(package_graph(graph, p)) for p in packages()}
    assert {p: c for p, c in circles.items() if c is not None} == {}
