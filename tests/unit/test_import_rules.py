"""DESIGN.md §3: imports flow one way, no two modules import each other, and heavy dependencies
stop at the backend boundary.

`utils` <- `models` <- `rollout` <- `backends` <- `ray` <- entry points. `utils` never imports
`models`; `utils`, `models` and `rollout` never import `backends` or `ray`; the backends never
import each other; megatron, sglang and ray are imported only by the packages that own them; no
import circle between slime modules (module-level graph: `from pkg import name` is an edge to
`pkg.name` when that is a module, else to `pkg`; a package's own `__init__` run by importing its
submodules is not an edge). Every import statement counts, including ones inside functions.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slime"

# package prefix of the importing module -> module prefixes it must not import
FORBIDDEN = {
    "slime.utils": ("slime.backends", "slime.ray", "slime.rollout", "slime.models"),
    "slime.models": ("slime.backends", "slime.ray", "slime.rollout"),
    "slime.rollout": ("slime.backends", "slime.ray"),
    "slime.backends": ("slime.ray",),
    "slime.backends.megatron_utils": ("slime.backends.sglang_utils", "slime.backends.local_engine"),
    "slime.backends.sglang_utils": ("slime.backends.megatron_utils", "slime.backends.local_engine"),
    "slime.backends.local_engine": ("slime.backends.megatron_utils", "slime.backends.sglang_utils"),
}

# third-party package -> the slime packages allowed to import it
HEAVY = {
    "megatron": ("slime.backends.megatron_utils",),
    "transformer_engine": ("slime.backends.megatron_utils",),
    "sglang": ("slime.backends.sglang_utils", "slime.utils.arguments"),
    "ray": ("slime.ray",),
    "wandb": ("slime.utils.logging_sinks",),
    "tensorboard": ("slime.utils.logging_sinks",),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str):
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """{module: {imported slime module: first line}}: every import statement of each module, each
    target resolved to the slime module it names (`from a import b` is `a.b` when that is a module)."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_target(node, package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `import a.b.c` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
    return graph


def _from_target(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle per group of modules that import each other (a strongly connected component):
    the shortest path `[a, ..., a]` from its smallest module name back to itself; empty when the
    graph has none."""
    cycles = []
    for component in _components(graph):
        start = min(component)
        paths, queue = {start: [start]}, [start]
        while queue:  # breadth first inside the component
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    queue = []
                    cycles.append(paths[node] + [start])
                    break
                if nxt in component and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
    return sorted(cycles)


def _components(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Kosaraju, iterative)."""
    order, done = [], set()
    for root in sorted(graph):
        if root in done:
            continue
        done.add(root)
        stack = [(root, iter(sorted(graph[root])))]
        while stack:
            node, edges = stack[-1]
            nxt = next((n for n in edges if n not in done), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                done.add(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    reverse: dict[str, set[str]] = {}
    for node, edges in graph.items():
        for nxt in edges:
            reverse.setdefault(nxt, set()).add(node)
    components, assigned = [], set()
    for root in reversed(order):
        if root in assigned:
            continue
        component, todo = set(), [root]
        while todo:
            node = todo.pop()
            if node not in assigned:
                assigned.add(node)
                component.add(node)
                todo += [n for n in reverse.get(node, ()) if n not in assigned]
        if len(component) > 1:
            components.append(component)
    return components


def _describe(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    hops = [f"{modules[a].relative_to(ROOT)}:{graph[a][b]} imports {b}" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n    " + "\n    ".join(hops)


def test_no_import_circles():
    modules = _modules()
    graph = import_graph(modules)
    cycles = import_cycles(graph)
    assert not cycles, "import circles (DESIGN.md §3: a circle is one concern split in two):\n" + "\n".join(
        _describe(c, graph, modules) for c in cycles)


@pytest.mark.parametrize("graph,expect", [
    ({"a": {"b": 1}, "b": {"a": 2}}, [["a", "b", "a"]]),
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 3}, "d": {"a": 1}}, [["a", "b", "c", "a"]]),
    ({"a": {"b": 1, "c": 1}, "b": {"c": 1}, "c": {}}, []),
])
def test_cycle_finder_catches_what_it_should(graph, expect):
    assert import_cycles(graph) == expect


def test_from_import_of_a_submodule_is_an_edge_to_it(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from p import b\n")
    (pkg / "b.py").write_text("from p.a import f\n")
    modules = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    graph = import_graph(modules)
    assert graph == {"p": {}, "p.a": {"p.b": 2}, "p.b": {"p.a": 1}}
    assert import_cycles(graph) == [["p.a", "p.b", "p.a"]]


def test_models_import_no_torch():
    """Argument parsing imports `slime.models`: it must not pull torch in at import time."""
    code = "import sys, slime.models; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def _violations():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for lineno, target in _imports(path, module):
            for owner, banned in FORBIDDEN.items():
                if module == owner or module.startswith(owner + "."):
                    for prefix in banned:
                        if target == prefix or target.startswith(prefix + "."):
                            found.append(f"{path.relative_to(ROOT)}:{lineno} imports {target}")
            top = target.split(".")[0]
            if top in HEAVY and not any(module == a or module.startswith(a + ".") for a in HEAVY[top]):
                found.append(f"{path.relative_to(ROOT)}:{lineno} imports heavy dependency {target}")
    return found


def test_import_direction_and_heavy_dependencies():
    violations = _violations()
    assert not violations, "import rules of DESIGN.md §3 broken:\n" + "\n".join(violations)


@pytest.mark.parametrize(
    "module,target,expect",
    [("slime.utils.x", "slime.backends.megatron_utils", True), ("slime.ray.x", "slime.backends", False),
     ("slime.utils.arguments.x", "slime.models", True), ("slime.models.x", "slime.rollout.x", True),
     ("slime.rollout.x", "slime.models", False)],
)
def test_rule_table_catches_what_it_should(module, target, expect):
    hit = any(
        (module == owner or module.startswith(owner + "."))
        and any(target == p or target.startswith(p + ".") for p in banned)
        for owner, banned in FORBIDDEN.items()
    )
    assert hit is expect


# DESIGN.md §2b.4: collectives on groups that are NCCL on GPU take only device tensors. Our code
# calls torch.distributed's collectives (and new_group, so that host groups are marked) only
# through slime/backends/megatron_utils/collectives.py, which places and checks the tensors.
COLLECTIVES_HELPER = "slime/backends/megatron_utils/collectives.py"
RAW_COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "barrier", "monitored_barrier", "broadcast_object_list", "all_gather_object", "gather_object",
    "scatter_object_list", "send_object_list", "recv_object_list", "new_group", "new_subgroups",
})


def _distributed_aliases(tree) -> set[str]:
    """Names bound to torch.distributed in a module (`import torch.distributed as dist`, ...)."""
    names = {"torch.distributed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            names |= {a.asname or a.name for a in node.names if a.name == "distributed"}
    return names


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def raw_collectives(source: str, filename: str = "<source>") -> list[str]:
    """`line: call` for every raw torch.distributed collective used in `source`."""
    tree = ast.parse(source, filename=filename)
    aliases = _distributed_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in RAW_COLLECTIVES and _dotted(node.value) in aliases:
            found.append(f"{node.lineno}: {_dotted(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed"):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name in RAW_COLLECTIVES]
    return found


def test_collectives_only_through_the_helper():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel != COLLECTIVES_HELPER:
            found += [f"{rel}:{hit}" for hit in raw_collectives(path.read_text(), rel)]
    assert not found, ("raw torch.distributed collectives outside " + COLLECTIVES_HELPER
                       + " (use slime.backends.megatron_utils.collectives):\n" + "\n".join(found))


@pytest.mark.parametrize("source,expect", [
    ("import torch.distributed as dist\ndist.all_reduce(t)", ["2: dist.all_reduce"]),
    ("import torch\ntorch.distributed.broadcast(t, 0)", ["2: torch.distributed.broadcast"]),
    ("from torch import distributed as d\nd.new_group([0])", ["2: d.new_group"]),
    ("from torch.distributed import barrier", ["1: from torch.distributed import barrier"]),
    ("import torch.distributed as dist\ndist.get_rank(); group.broadcast(t)", []),
])
def test_raw_collective_rule_catches_what_it_should(source, expect):
    assert raw_collectives(source) == expect
