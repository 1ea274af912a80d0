"""SGLang domain: the ``--sglang-*`` passthrough of SGLang's ``ServerArgs`` fields, slime's own
engine/router flags and the ``--router-*`` options of sglang-router.

The passthrough comes from the installed ``sglang.srt.server_args.ServerArgs`` dataclass when it
imports, else from ``sglang_server_args.json`` (written by ``tools/gen_sglang_server_args.py`` from
SGLang ``PINNED_SGLANG_VERSION``). Fields the framework controls are not passed through.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from slime.utils.arguments.common import ArgumentError, require

logger = logging.getLogger(__name__)

PINNED_SGLANG_VERSION = "0.5.10"
FALLBACK_FILE = Path(__file__).with_name("sglang_server_args.json")
EXCLUDED_FIELDS = ("model_path", "tp_size", "port", "nnodes", "node_rank", "dist_init_addr", "random_seed",
                   "base_gpu_id", "nccl_port", "enable_memory_saver", "skip_server_warmup")
# slime's own --sglang-* flags; a ServerArgs field with the same dest is not passed through.
_OWN_DESTS = ("sglang_router_ip", "sglang_router_port", "sglang_server_concurrency")
# (flag, type, help) of sglang-router options; None keeps the router's own default.
ROUTER_FLAGS = (
    ("--router-policy", str, "Routing policy: random, round_robin, cache_aware or power_of_two."),
    ("--router-balance-abs-threshold", int, "cache_aware: load difference that triggers load balancing."),
    ("--router-balance-rel-threshold", float, "cache_aware: relative load ratio that triggers balancing."),
    ("--router-cache-threshold", float, "cache_aware: prefix-match ratio that routes to the cached worker."),
    ("--router-request-timeout-secs", int, "Router request timeout in seconds."),
    ("--router-worker-startup-timeout-secs", int, "Seconds the router waits for a worker to become healthy."),
    ("--router-health-check-interval-secs", int, "Seconds between the router's worker health checks."),
)
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
_SCALARS = {"bool": "bool", "int": "int", "float": "float", "str": "str"}
_LISTS = {"List", "list", "Sequence", "Tuple", "tuple"}


def _kind_of_node(node: ast.AST) -> tuple[str, list | None]:
    if isinstance(node, ast.Name):
        return _SCALARS.get(node.id, "json"), None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _kind_of_node(ast.parse(node.value, mode="eval").body)
    if not isinstance(node, ast.Subscript) or not isinstance(node.value, ast.Name):
        return "json", None
    outer = node.value.id
    members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if outer in ("A", "Annotated"):  # newer SGLang: A[T, help] / Annotated[T, ...]
        return _kind_of_node(members[0])
    if outer in ("Optional", "Union"):
        real = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)
                and not (isinstance(m, ast.Name) and m.id == "None")]
        return _kind_of_node(real[0]) if len(real) == 1 else ("json", None)
    if outer == "Literal":
        values = [m.value for m in members if isinstance(m, ast.Constant) and m.value is not None]
        return ("str", values) if all(isinstance(v, str) for v in values) else ("json", None)
    if outer in _LISTS and len(members) == 1 and isinstance(members[0], ast.Name):
        element = _SCALARS.get(members[0].id)
        return (f"list_{element}", None) if element in ("int", "float", "str") else ("json", None)
    return "json", None


def annotation_kind(annotation: str) -> tuple[str, list | None]:
    """Map a ServerArgs annotation string to (kind, choices).

    kind is one of bool, int, float, str, list_int, list_float, list_str, json (passed as a string);
    choices lists a Literal's string values (else None). ``Optional[X]`` maps like X.
    """
    return _kind_of_node(ast.parse(annotation, mode="eval").body)


def field_entry(name: str, annotation: str, default: Any, default_source: str | None = None) -> dict:
    """One record of the passthrough table: name, annotation, kind, choices, default (JSON-able).

    ``default_source`` holds the expression of a default that is not a literal (its value then
    depends on the machine and ``default`` is None).
    """
    kind, choices = annotation_kind(annotation)
    if isinstance(default, (tuple, set, frozenset)):
        default = sorted(default) if isinstance(default, (set, frozenset)) else list(default)
    entry = {"name": name, "annotation": annotation, "kind": kind, "choices": choices, "default": default}
    if default_source is not None:
        entry["default"] = None
        entry["default_source"] = default_source
    return entry


def _annotation_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _live_default(field: dataclasses.Field) -> tuple[Any, str | None]:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return None, None
    try:
        json.dumps(value)
    except TypeError:
        return None, repr(value)
    return value, None


def live_server_arg_fields() -> list[dict] | None:
    """Fields of the installed SGLang's ServerArgs, or None when sglang is not importable."""
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        module = importlib.import_module("sglang.srt.server_args")
    except ImportError as error:  # sglang present but its GPU dependencies are not
        logger.warning("sglang.srt.server_args does not import (%s); using %s", error, FALLBACK_FILE.name)
        return None
    if not dataclasses.is_dataclass(module.ServerArgs):
        logger.warning("installed sglang's ServerArgs is not a dataclass (newer layout); using %s for %s",
                       FALLBACK_FILE.name, PINNED_SGLANG_VERSION)
        return None
    entries = []
    for field in dataclasses.fields(module.ServerArgs):
        if field.name.startswith("_"):
            continue
        default, source = _live_default(field)
        entries.append(field_entry(field.name, _annotation_text(field.type), default, source))
    return entries


def fallback_server_arg_fields() -> list[dict]:
    """Fields recorded in ``sglang_server_args.json`` for SGLang PINNED_SGLANG_VERSION."""
    with open(FALLBACK_FILE, encoding="utf-8") as handle:
        data = json.load(handle)
    if data["sglang_version"] != PINNED_SGLANG_VERSION:
        raise ArgumentError(f"{FALLBACK_FILE} is for sglang {data['sglang_version']}, expected "
                            f"{PINNED_SGLANG_VERSION}: rerun tools/gen_sglang_server_args.py")
    return data["fields"]


def server_arg_fields() -> list[dict]:
    """Passthrough fields: the installed SGLang's when it imports, else the pinned fallback list."""
    return live_server_arg_fields() or fallback_server_arg_fields()


def passthrough_fields(fields: list[dict]) -> list[dict]:
    """Drop framework-controlled fields and fields that collide with slime's own --sglang-* flags."""
    return [f for f in fields if f["name"] not in EXCLUDED_FIELDS and f"sglang_{f['name']}" not in _OWN_DESTS]


def add_passthrough_flag(group, entry: dict) -> None:
    """Add ``--sglang-<name>`` (dest ``sglang_<name>``) for one passthrough record to ``group``."""
    flag, dest = "--sglang-" + entry["name"].replace("_", "-"), "sglang_" + entry["name"]
    kind, default = entry["kind"], entry["default"]
    help_text = f"SGLang ServerArgs.{entry['name']} ({entry['annotation']})."
    if kind == "bool":
        action = argparse.BooleanOptionalAction if default is True else "store_true"
        group.add_argument(flag, dest=dest, action=action, default=default, help=help_text)
    elif kind.startswith("list_"):
        element = {"list_int": int, "list_float": float, "list_str": str}[kind]
        group.add_argument(flag, dest=dest, type=element, nargs="+", default=default, help=help_text)
    else:
        # A string default (an expression such as "auto") keeps the value a string.
        scalar = str if isinstance(default, str) else {"int": int, "float": float, "str": str, "json": str}[kind]
        group.add_argument(flag, dest=dest, type=scalar, choices=entry["choices"] or None,
                           default=default, help=help_text)


def _add_own(group) -> None:
    group.add_argument("--sglang-router-ip", type=str, default=None,
                       help="IP of an existing sglang-router (None: slime starts one).")
    group.add_argument("--sglang-router-port", type=int, default=None,
                       help="Port of the sglang-router (None: a free port).")
    group.add_argument("--sglang-server-concurrency", type=int, default=512,
                       help="Maximum concurrent requests slime sends to the engines.")
    for flag, kind, help_text in ROUTER_FLAGS:
        choices = ROUTER_POLICIES if flag == "--router-policy" else None
        group.add_argument(flag, type=kind, choices=choices, default=None,
                           help=help_text + " (None: sglang-router's default)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add slime's engine and router flags and the --sglang-* passthrough as one argument group."""
    group = parser.add_argument_group("sglang", "SGLang engines (ServerArgs passthrough) and sglang-router.")
    _add_own(group)
    for entry in passthrough_fields(server_arg_fields()):
        add_passthrough_flag(group, entry)


def engine_tp_size(args: argparse.Namespace) -> int:
    """Tensor-parallel size of one engine: --rollout-num-gpus-per-engine / --sglang-pp-size."""
    return args.rollout_num_gpus_per_engine // getattr(args, "sglang_pp_size", 1)


def sglang_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """ServerArgs keyword arguments the user changed: {field name: value} for every passthrough
    --sglang-x whose value differs from the field's default."""
    out = {}
    for entry in passthrough_fields(server_arg_fields()):
        value = getattr(args, "sglang_" + entry["name"], entry["default"])
        if value != entry["default"]:
            out[entry["name"]] = value
    return out


def validate(args: argparse.Namespace) -> list[str]:
    """--rollout-num-gpus-per-engine divisible by --sglang-pp-size (engine tp = the quotient);
    --sglang-dp-size > 1 needs --sglang-enable-dp-attention and must divide engine tp, as must
    --sglang-ep-size; --sglang-server-concurrency >= 1; --sglang-router-port a valid port."""
    warnings: list[str] = []
    pp, dp, ep = (getattr(args, f"sglang_{name}_size", 1) or 1 for name in ("pp", "dp", "ep"))
    per_engine = args.rollout_num_gpus_per_engine
    require(per_engine % pp == 0,
            f"--rollout-num-gpus-per-engine {per_engine} is not divisible by --sglang-pp-size {pp}")
    tp = per_engine // pp
    if dp > 1:
        require(getattr(args, "sglang_enable_dp_attention", False),
                f"--sglang-dp-size {dp} needs --sglang-enable-dp-attention")
        require(tp % dp == 0, f"engine tp size {tp} (--rollout-num-gpus-per-engine / --sglang-pp-size) is not "
                f"divisible by --sglang-dp-size {dp}")
    require(tp % ep == 0, f"engine tp size {tp} (--rollout-num-gpus-per-engine / --sglang-pp-size) is not "
            f"divisible by --sglang-ep-size {ep}")
    require(args.sglang_server_concurrency >= 1,
            f"--sglang-server-concurrency must be >= 1, got {args.sglang_server_concurrency}")
    port = args.sglang_router_port
    require(port is None or 0 < port < 65536, f"--sglang-router-port {port} is not a valid port")
    return warnings
