"""DESIGN.md §3: imports flow one way, and heavy dependencies stop at the backend boundary.

`utils` <- `rollout` <- `backends` <- `ray` <- entry points. `utils` and `rollout` never import
`backends` or `ray`; the backends never import each other; megatron, sglang and ray are imported
only by the packages that own them. Every import statement counts, including ones inside functions.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slime"

# package prefix of the importing module -> module prefixes it must not import
FORBIDDEN = {
    "slime.utils": ("slime.backends", "slime.ray", "slime.rollout"),
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
    [("slime.utils.x", "slime.backends.megatron_utils", True), ("slime.ray.x", "slime.backends", False)],
)
def test_rule_table_catches_what_it_should(module, target, expect):
    hit = any(
        (module == owner or module.startswith(owner + "."))
        and any(target == p or target.startswith(p + ".") for p in banned)
        for owner, banned in FORBIDDEN.items()
    )
    assert hit is expect
