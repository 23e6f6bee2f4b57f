"""The import graph of the packages has no cycle, and ``spec_fast`` imports only downwards through its floors
(docs/engine.md, "Layout": each module sits above what it imports).

Read from the source with ``ast``, without importing anything: every ``import`` and ``from ... import`` of a
module of the package counts, also inside functions (a lazy import still ties two modules together); only
imports under ``if TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_names(package: str) -> dict[str, Path]:
    names = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports (``from pkg import sub`` names the submodule ``pkg.sub``)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return {name for name in found if name in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = walk(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = walk(start)
            if cycle:
                return cycle
    return None


@pytest.mark.parametrize("package", ["spec_ref", "spec_fast", "conformance"])
def test_the_package_imports_form_no_cycle(package: str) -> None:
    modules = module_names(package)
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


#: ``spec_fast``'s floors, lowest first: a module imports only from its own floor or lower ones
SPEC_FAST_FLOORS: tuple[tuple[str, ...], ...] = (
    ("spec_fast", "spec_fast._hf_compat", "spec_fast._lazy", "spec_fast._sampling", "spec_fast._validate",
     "spec_fast.cache", "spec_fast.chat", "spec_fast.decoding", "spec_fast.detokenize", "spec_fast.draws",
     "spec_fast.flat_tree", "spec_fast.kv_cache", "spec_fast.metrics", "spec_fast.rng", "spec_fast.strategies",
     "spec_fast.tree_attention"),
    ("spec_fast.lean",),
    ("spec_fast.verify",),
    ("spec_fast.drafts",),
    ("spec_fast.nde",),
    ("spec_fast.engine",),
    ("spec_fast.api", "spec_fast.models", "spec_fast.settings"),
    ("spec_fast.serve",),
    ("spec_fast.cli", "spec_fast.__main__"),
)


def floor_of(module: str) -> int:
    """The floor of ``module``: that of the longest floor entry equal to it or a package above it."""
    best, level = -1, -1
    for index, names in enumerate(SPEC_FAST_FLOORS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, level = len(name), index
    if level < 0:
        raise AssertionError(f"{module} is on no floor: add it to SPEC_FAST_FLOORS (and to docs/engine.md)")
    return level


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{name} (floor {floor_of(name)}) -> {dep} (floor {floor_of(dep)})"
            for name in sorted(graph) for dep in sorted(graph[name]) if floor_of(dep) > floor_of(name)]


def test_spec_fast_imports_only_downwards() -> None:
    modules = module_names("spec_fast")
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    assert upward_imports(graph) == []


def test_the_floor_check_finds_a_planted_upward_import() -> None:
    graph = {"spec_fast.drafts.chain": {"spec_fast.engine.decoder"}, "spec_fast.engine.decoder": {"spec_fast.rng"}}
    assert upward_imports(graph) == ["spec_fast.drafts.chain (floor 3) -> spec_fast.engine.decoder (floor 5)"]


def test_no_spec_fast_module_is_much_over_500_lines() -> None:
    modules = module_names("spec_fast")
    long = {name: n for name, path in modules.items() if (n := len(path.read_text().splitlines())) > 520}
    assert long == {}
