"""SGLang domain: the ``--sglang-*`` passthrough of SGLang's server options, slime's own
engine/router flags and the ``--router-*`` options of sglang-router.

The passthrough lists the options of the installed sglang's own parser when it imports, else
those of ``sglang_server_args.json`` (release ``PINNED_SGLANG_VERSION``; see
``slime.utils.arguments.sglang_fields``). Fields the framework controls are not passed through.
An option an older release had under another name (``RENAMED_FIELDS``, e.g. ``--cuda-graph-bs``,
now ``--cuda-graph-bs-decode``) keeps its slime flag and is mapped to the new name(s) on the
launch line, or refused at parse time naming the flag and the release when it cannot be.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from slime.utils.arguments.common import require
from slime.utils.arguments.sglang_fields import (FALLBACK_FILE, PINNED_SGLANG_VERSION, RENAMED_FIELDS,
                                                 fallback_server_arg_fields, live_server_arg_fields,
                                                 renamed_fields, server_arg_fields, server_args_version)

__all__ = ["EXCLUDED_FIELDS", "FALLBACK_FILE", "PINNED_SGLANG_VERSION", "RENAMED_FIELDS", "add_arguments",
           "engine_tp_size", "fallback_server_arg_fields", "live_server_arg_fields", "server_arg_fields",
           "server_args_version", "sglang_overrides", "validate"]

logger = logging.getLogger(__name__)

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
DEFAULT_ENGINE_START_TIMEOUT = 600.0


def passthrough_fields(fields: list[dict]) -> list[dict]:
    """Drop framework-controlled fields and fields that collide with slime's own --sglang-* flags."""
    return [f for f in fields if f["name"] not in EXCLUDED_FIELDS and f"sglang_{f['name']}" not in _OWN_DESTS]


def add_passthrough_flag(group, entry: dict) -> None:
    """Add ``--sglang-<name>`` (dest ``sglang_<name>``) for one passthrough record to ``group``."""
    flag, dest = "--sglang-" + entry["name"].replace("_", "-"), "sglang_" + entry["name"]
    kind, default = entry["kind"], entry["default"]
    help_text = f"SGLang {entry['flag']}: {entry.get('help') or entry['name']}."
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
    group.add_argument("--engine-start-timeout", type=float, default=DEFAULT_ENGINE_START_TIMEOUT,
                       help="Seconds a rollout engine (SGLang or the local engine) may take to answer /health "
                            "after it starts; a large FP8 engine can need more than the default.")
    for flag, kind, help_text in ROUTER_FLAGS:
        choices = ROUTER_POLICIES if flag == "--router-policy" else None
        group.add_argument(flag, type=kind, choices=choices, default=None,
                           help=help_text + " (None: sglang-router's default)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add slime's engine and router flags and the --sglang-* passthrough as one argument group."""
    group = parser.add_argument_group("sglang", "SGLang engines (ServerArgs passthrough) and sglang-router.")
    _add_own(group)
    fields = passthrough_fields(server_arg_fields())
    for entry in fields:
        add_passthrough_flag(group, entry)
    _add_renamed(group, {entry["name"] for entry in fields})


def _add_renamed(group, known: set[str]) -> None:
    """An old option name this release lacks stays a slime flag (mapped or refused later)."""
    for old, (new, fate) in RENAMED_FIELDS.items():
        if old in known:
            continue
        group.add_argument("--sglang-" + old.replace("_", "-"), dest="sglang_" + old, type=int, nargs="+",
                           default=None, help=f"SGLang's old --{old.replace('_', '-')} ({fate}): passed as "
                           f"--{' / --'.join(n.replace('_', '-') for n in new)}.")


def engine_tp_size(args: argparse.Namespace) -> int:
    """Tensor-parallel size of one engine: --rollout-num-gpus-per-engine / --sglang-pp-size."""
    return args.rollout_num_gpus_per_engine // getattr(args, "sglang_pp_size", 1)


def sglang_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """ServerArgs keyword arguments the user changed: {field name: value} for every passthrough
    --sglang-x whose value differs from the field's default."""
    fields = passthrough_fields(server_arg_fields())
    out = {}
    for entry in fields:
        value = getattr(args, "sglang_" + entry["name"], entry["default"])
        if value != entry["default"]:
            out[entry["name"]] = value
    for old, new in renamed_fields({entry["name"] for entry in fields}).items():
        value = getattr(args, "sglang_" + old, None)
        if value is not None:
            out.update({name: out.get(name, value) for name in new})
    return out


def _check_renamed(args: argparse.Namespace) -> None:
    known = {entry["name"] for entry in passthrough_fields(server_arg_fields())}
    mapped = renamed_fields(known)
    for old, (new, _since) in RENAMED_FIELDS.items():
        if old in known or getattr(args, "sglang_" + old, None) is None:
            continue
        flag = "--sglang-" + old.replace("_", "-")
        require(old in mapped, f"{flag}: sglang {server_args_version()} has no {old} option and none of "
                f"{', '.join(new)} to map it to")
        for name in new:
            value = getattr(args, "sglang_" + name, None)
            require(value in (None, getattr(args, "sglang_" + old)),
                    f"{flag} and --sglang-{name.replace('_', '-')} disagree (sglang {server_args_version()} "
                    f"maps the first to the second): give one of them")


def validate(args: argparse.Namespace) -> list[str]:
    """--rollout-num-gpus-per-engine divisible by --sglang-pp-size (engine tp = the quotient);
    --sglang-dp-size > 1 needs --sglang-enable-dp-attention and must divide engine tp, as must
    --sglang-ep-size; --sglang-server-concurrency >= 1; --sglang-router-port a valid port;
    --engine-start-timeout > 0; a renamed option (RENAMED_FIELDS) maps onto this release."""
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
    require(args.engine_start_timeout > 0, f"--engine-start-timeout must be > 0, got {args.engine_start_timeout}")
    _check_renamed(args)
    return warnings
