"""Write slime/utils/arguments/sglang_server_args.json: the fields of SGLang's ServerArgs dataclass
(name, annotation, passthrough kind, choices, default) read from a pinned SGLang's source.

SGLang itself is not imported (its dependencies need a GPU): the script parses
``sglang/srt/server_args.py`` with ``ast``, from a wheel or from an unpacked file.

    pip download --no-deps sglang==0.5.10 -d /tmp/sgl
    python tools/gen_sglang_server_args.py --wheel /tmp/sgl/sglang-0.5.10-*.whl --version 0.5.10
"""

from __future__ import annotations

import argparse
import ast
import json
import zipfile
from pathlib import Path

from slime.utils.arguments.sglang import FALLBACK_FILE, field_entry

_SOURCE_IN_WHEEL = "sglang/srt/server_args.py"
_FACTORIES = {"list": [], "dict": {}, "set": [], "tuple": []}


def _default_of(value: ast.AST | None):
    """Return (default, default_source) for a class-body assignment value."""
    if value is None:
        return None, None
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("dataclasses.field", "field"):
        keywords = {k.arg: k.value for k in value.keywords}
        if "default" in keywords:
            return _default_of(keywords["default"])
        factory = keywords.get("default_factory")
        if isinstance(factory, ast.Name) and factory.id in _FACTORIES:
            return _FACTORIES[factory.id], None
        if isinstance(factory, ast.Lambda):
            return _default_of(factory.body)
        return None, ast.unparse(factory) if factory is not None else None
    try:
        return ast.literal_eval(value), None
    except ValueError:
        return None, ast.unparse(value)


def parse_server_args(source: str) -> list[dict]:
    """Return the passthrough records of every public field of ``class ServerArgs`` in ``source``."""
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"]
    if not classes:
        raise SystemExit("no `class ServerArgs` in the given server_args.py")
    entries = []
    for node in classes[0].body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        name = node.target.id
        if name.startswith("_"):
            continue
        default, source_text = _default_of(node.value)
        entries.append(field_entry(name, ast.unparse(node.annotation), default, source_text))
    return entries


def _read_source(cli: argparse.Namespace) -> str:
    if cli.wheel:
        with zipfile.ZipFile(cli.wheel) as wheel:
            return wheel.read(_SOURCE_IN_WHEEL).decode("utf-8")
    return Path(cli.source).read_text(encoding="utf-8")


def main() -> None:
    """Parse the command line, read the source and write the JSON table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--wheel", help="Path of an sglang wheel.")
    where.add_argument("--source", help="Path of an unpacked sglang/srt/server_args.py.")
    parser.add_argument("--version", required=True, help="SGLang version the source belongs to.")
    parser.add_argument("--out", default=str(FALLBACK_FILE), help="Output JSON path.")
    cli = parser.parse_args()
    fields = parse_server_args(_read_source(cli))
    data = {"sglang_version": cli.version, "source": _SOURCE_IN_WHEEL, "fields": fields}
    Path(cli.out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(fields)} ServerArgs fields of sglang {cli.version} to {cli.out}")


if __name__ == "__main__":
    main()
