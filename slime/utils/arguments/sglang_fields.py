"""The table of SGLang server options behind the ``--sglang-*`` passthrough.

One record per option of ``python -m sglang.launch_server``: ``name`` (the ServerArgs field, the
option's argparse dest), ``flag`` (the option string our launcher writes), ``kind`` (bool, int,
float, str, list_int, list_float, list_str, json), ``choices``, ``default`` (JSON-able, else None
with ``default_source``), ``help`` and ``aliases`` (SGLang's other long spellings of the option,
e.g. ``--expert-parallel-size`` and ``--ep`` for ``--ep-size``, each also a ``--sglang-*`` flag).

The records are read from SGLang's own argument parser (``ServerArgs.add_cli_args``), which is
the truth of what its command line accepts in every release: up to 0.5.15 ServerArgs is a
dataclass, from 0.5.23 a msgspec Struct assembled from ``arg_groups/fields/`` (cli names and
aliases that differ from the field name, fields with no option). The installed sglang is used
when it imports (GPU nodes); otherwise ``sglang_server_args.json``, written by
``tools/gen_sglang_server_args.py`` from release ``PINNED_SGLANG_VERSION``.

Every supported release's table is kept (``RELEASE_FILES``; slime's recipes are written for
0.5.15-era SGLang, whose old spellings such as ``--cuda-graph-max-bs``, ``--nsa-prefill-backend``
or ``--mamba-scheduler-strategy`` were aliases that 0.5.23 renamed or dropped).
``union_server_arg_fields`` is the ``--sglang-*`` surface: the target release's options (the
installed one, else the pinned table) plus each other supported release's options it lacks, with
every release's spellings of an option merged into its aliases, so an old spelling reaches the
target release's name; an option the target release lacks is refused at parse time naming the
option and the release (``sglang.validate``).

``RENAMED_FIELDS`` maps options that slime users still pass under an older name to the names of
the releases that renamed them.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from slime.utils.arguments.common import ArgumentError


PINNED_SGLANG_VERSION = "0.5.23"
FALLBACK_FILE = Path(__file__).with_name("sglang_server_args.json")
# every supported release -> its option table (the pinned one is FALLBACK_FILE), newest first
RELEASE_FILES = {PINNED_SGLANG_VERSION: FALLBACK_FILE,
                 "0.5.15.post1": Path(__file__).with_name("sglang_server_args_0.5.15.post1.json")}
# old field -> (the fields that replace it, what became of it). SGLang split the CUDA-graph batch
# sizes into decode and prefill; the old option listed the decode graph's sizes.
RENAMED_FIELDS = {"cuda_graph_bs": (("cuda_graph_bs_decode",), "a deprecated alias of --cuda-graph-bs-decode "
                                    "in 0.5.15.post1, removed (ambiguous) in 0.5.23")}
_ELEMENT_KINDS = {int: "int", float: "float", str: "str", None: "str"}
_HELP_CHARS = 160


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "bool"
    if action.nargs in ("+", "*"):
        element = _ELEMENT_KINDS.get(action.type)
        return f"list_{element}" if element else "json"
    if action.nargs is not None:
        return "json"
    return _ELEMENT_KINDS.get(action.type, "json")


def _short_help(text: str | None) -> str:
    text = " ".join((text or "").split()).replace("%", "%%")
    first = text.split(". ")[0].rstrip(".")
    return first if len(first) <= _HELP_CHARS else first[:_HELP_CHARS - 3] + "..."


def _negation(action: argparse.Action, option: str) -> bool:
    """Whether `option` is the --no-X half of a BooleanOptionalAction (not an alias)."""
    return isinstance(action, argparse.BooleanOptionalAction) and option.startswith("--no-")


def action_entry(action: argparse.Action) -> dict:
    """The table record of one option of SGLang's parser (see the module docstring)."""
    long_flags = [s for s in action.option_strings if s.startswith("--")]
    own = "--" + action.dest.replace("_", "-")
    flag = own if own in long_flags else long_flags[0]
    kind = _kind(action)
    default = action.default
    if kind == "bool":
        default = bool(default) if default is not None else False
    entry = {"name": action.dest, "flag": flag, "kind": kind,
             "choices": sorted(map(str, action.choices)) if action.choices else None,
             "default": default, "help": _short_help(action.help),
             "aliases": [s for s in long_flags if s != flag and not _negation(action, s)]}
    if isinstance(default, (tuple, set, frozenset)):
        entry["default"] = sorted(default) if isinstance(default, (set, frozenset)) else list(default)
    try:
        json.dumps(entry["default"])
    except TypeError:
        entry["default"], entry["default_source"] = None, repr(default)
    return entry


def entries_from_parser(parser: argparse.ArgumentParser) -> list[dict]:
    """Records of every long option of `parser` (SGLang's), one per dest, in parser order; an
    option spelled like its dest wins over an alias or a deprecated spelling of the same dest."""
    by_dest: dict[str, dict] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public list of options
        if action.dest in ("help", "config") or not any(s.startswith("--") for s in action.option_strings):
            continue
        entry = action_entry(action)
        kept = by_dest.get(entry["name"])
        if kept is None or (kept["flag"] != "--" + kept["name"].replace("_", "-")
                            and entry["flag"] == "--" + entry["name"].replace("_", "-")):
            if kept is not None and kept["kind"] == entry["kind"]:
                entry["aliases"] = _merged(entry, kept)
            by_dest[entry["name"]] = entry
        elif kept["kind"] == entry["kind"]:  # another spelling of the same option
            kept["aliases"] = _merged(kept, entry)
    return list(by_dest.values())


def _merged(entry: dict, other: dict) -> list[str]:
    """`entry`'s aliases plus every spelling of `other` (same dest and kind) but entry's flag."""
    spellings = entry["aliases"] + [other["flag"], *other["aliases"]]
    return [s for s in dict.fromkeys(spellings) if s != entry["flag"]]


def sglang_parser(server_args_module) -> argparse.ArgumentParser:
    """SGLang's own launch_server parser, built the way its ``prepare_server_args`` builds it."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_module.ServerArgs.add_cli_args(parser)
    return parser


@functools.lru_cache(maxsize=1)
def _live() -> tuple[str, tuple[dict, ...]] | None:
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        module = importlib.import_module("sglang.srt.server_args")
    except ImportError as error:  # installed but broken: its flags would silently be a stale table's
        raise ImportError(f"sglang is installed but sglang.srt.server_args does not import ({error}); "
                          "install sglang with its dependencies (pip install sglang) or uninstall it "
                          f"to use the pinned option table {FALLBACK_FILE.name}") from error
    version = importlib.import_module("sglang").__version__
    return version, tuple(entries_from_parser(sglang_parser(module)))


def live_server_arg_fields() -> list[dict] | None:
    """Options of the installed sglang's launch_server, or None when it does not import."""
    live = _live()
    return None if live is None else [dict(entry) for entry in live[1]]


def fallback_server_arg_fields() -> list[dict]:
    """Options recorded in ``sglang_server_args.json`` for SGLang PINNED_SGLANG_VERSION."""
    with open(FALLBACK_FILE, encoding="utf-8") as handle:
        data = json.load(handle)
    if data["sglang_version"] != PINNED_SGLANG_VERSION:
        raise ArgumentError(f"{FALLBACK_FILE} is for sglang {data['sglang_version']}, expected "
                            f"{PINNED_SGLANG_VERSION}: rerun tools/gen_sglang_server_args.py")
    return data["fields"]


def release_server_arg_fields(version: str) -> list[dict]:
    """Options recorded for supported release `version` (`RELEASE_FILES`)."""
    path = RELEASE_FILES[version]
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if data["sglang_version"] != version:
        raise ArgumentError(f"{path} is for sglang {data['sglang_version']}, expected {version}: "
                            "rerun tools/gen_sglang_server_args.py")
    return data["fields"]


def union_server_arg_fields() -> list[dict]:
    """The ``--sglang-*`` surface: the target release's records (`server_arg_fields`), then every
    other supported release's records it lacks (newest release first), each record's aliases
    extended by the other releases' spellings of the same option (same name and kind). Every
    record gets ``releases``: the releases that have the option (the target's version first)."""
    target = server_args_version()
    tables = [(target, server_arg_fields())]
    tables += [(v, release_server_arg_fields(v)) for v in RELEASE_FILES if v != target]
    union: dict[str, dict] = {}
    spelled: dict[str, str] = {}  # every option string -> the union record's name
    for version, fields in tables:
        for entry in fields:
            spellings = [entry["flag"], *(entry.get("aliases") or [])]
            name = entry["name"] if entry["name"] in union else next(
                (spelled[s] for s in spellings if s in spelled), None)  # renamed: known by another spelling
            if name is None:
                union[entry["name"]] = {**entry, "aliases": list(entry.get("aliases") or []), "releases": [version]}
                spelled.update(dict.fromkeys(spellings, entry["name"]))
                continue
            kept = union[name]
            kept["releases"].append(version)
            if kept["kind"] == entry["kind"]:
                kept["aliases"] = _merged(kept, {**entry, "aliases": entry.get("aliases") or []})
                spelled.update(dict.fromkeys(spellings, name))
    return list(union.values())


def server_arg_fields() -> list[dict]:
    """Passthrough options: the installed SGLang's when it imports, else the pinned table."""
    return live_server_arg_fields() or fallback_server_arg_fields()


def server_args_version() -> str:
    """The sglang release whose options `server_arg_fields` lists."""
    live = _live()
    return live[0] if live is not None else PINNED_SGLANG_VERSION


def renamed_fields(known: set[str]) -> dict[str, tuple[str, ...]]:
    """{old field: its replacements} for each RENAMED_FIELDS entry this table lacks but whose
    replacements it has (the old name stays a slime flag and is mapped on the launch line)."""
    return {old: new for old, (new, _since) in RENAMED_FIELDS.items()
            if old not in known and all(name in known for name in new)}


def entry_by_name(fields: list[dict]) -> dict[str, dict]:
    """{name: record} of a table."""
    return {entry["name"]: entry for entry in fields}


def render_option(entry: dict, value: Any) -> list[str]:
    """Command-line words of one option set to `value`: None and False -> none (SGLang's default,
    a store_true left off), True -> the bare flag, list kinds -> the flag then one word per item,
    json -> one word (a str as given, else its JSON), anything else -> str(value)."""
    flag, kind = entry["flag"], entry["kind"]
    if value is None or value is False:
        return []
    if kind == "bool":
        return [flag]
    if kind.startswith("list_"):
        return [flag, *map(str, value)] if value else []
    if kind == "json":
        return [flag, value if isinstance(value, str) else json.dumps(value, sort_keys=True)]
    return [flag, str(value)]
