"""SGLang domain: the ``--sglang-*`` passthrough of SGLang's server options, slime's own
engine/router flags and the ``--router-*`` options of sglang-router.

The passthrough is the union of the supported releases' options (``union_server_arg_fields``):
the target release is the installed sglang when its parser imports, else
``sglang_server_args.json`` (release ``PINNED_SGLANG_VERSION``); an old spelling of an option
(e.g. 0.5.15's ``--cuda-graph-max-bs``) reaches the target's name (``--cuda-graph-max-bs-decode``),
and an option the target release lacks (e.g. ``--sglang-nsa-prefill-backend`` with 0.5.23) is
refused at parse time naming the option and the release. Fields the framework controls are not
passed through.
An option an older release had under another name (``RENAMED_FIELDS``, e.g. ``--cuda-graph-bs``,
now ``--cuda-graph-bs-decode``) keeps its slime flag and is mapped to the new name(s) on the
launch line, or refused at parse time naming the flag and the release when it cannot be.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from slime.utils.arguments.common import ArgumentError, check_path_exists, require
from slime.utils.arguments.sglang_fields import (FALLBACK_FILE, PINNED_SGLANG_VERSION, RENAMED_FIELDS,
                                                 fallback_server_arg_fields, live_server_arg_fields,
                                                 renamed_fields, server_arg_fields, server_args_version,
                                                 union_server_arg_fields)

__all__ = ["EXCLUDED_FIELDS", "FALLBACK_FILE", "PINNED_SGLANG_VERSION", "RENAMED_FIELDS", "add_arguments",
           "engine_tp_size", "fallback_server_arg_fields", "live_server_arg_fields", "server_arg_fields",
           "server_args_version", "sglang_overrides", "union_server_arg_fields", "validate"]

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


def passthrough_flags(entry: dict) -> list[str]:
    """``--sglang-<name>`` of one passthrough record, then ``--sglang-<alias>`` for each other
    spelling SGLang's parser accepts (``--sglang-expert-parallel-size``, ``--sglang-ep`` for ep_size)."""
    own = "--sglang-" + entry["name"].replace("_", "-")
    aliases = ["--sglang-" + alias[2:] for alias in entry.get("aliases") or []]
    return [own, *(a for a in dict.fromkeys(aliases) if a != own)]


def add_passthrough_flag(group, entry: dict, taken: set[str] = frozenset()) -> None:
    """Add ``--sglang-<name>`` and its alias spellings (dest ``sglang_<name>``) for one passthrough
    record to ``group``; an alias spelling in ``taken`` (another option's flag) is left out."""
    own, *aliases = passthrough_flags(entry)
    flags = [own, *(a for a in aliases if a not in taken)]
    dest = "sglang_" + entry["name"]
    kind, default = entry["kind"], entry["default"]
    help_text = f"SGLang {entry['flag']}: {entry.get('help') or entry['name']}."
    if entry.get("releases") and server_args_version() not in entry["releases"]:
        help_text += f" (sglang {', '.join(entry['releases'])} only)"
    if kind == "bool":
        if default is True:  # --X / --no-X pairs; aliases keep SGLang's store_true meaning
            group.add_argument(own, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=help_text)
            if len(flags) > 1:
                group.add_argument(*flags[1:], dest=dest, action="store_true", help=argparse.SUPPRESS)
        else:
            group.add_argument(*flags, dest=dest, action="store_true", default=default, help=help_text)
    elif kind.startswith("list_"):
        element = {"list_int": int, "list_float": float, "list_str": str}[kind]
        group.add_argument(*flags, dest=dest, type=element, nargs="+", default=default, help=help_text)
    else:
        # A string default (an expression such as "auto") keeps the value a string.
        scalar = str if isinstance(default, str) else {"int": int, "float": float, "str": str, "json": str}[kind]
        group.add_argument(*flags, dest=dest, type=scalar, choices=entry["choices"] or None,
                           default=default, help=help_text)


def _add_deployment(group) -> None:
    """slime's SGLang config file and PD-disaggregation count (own block: issue 13)."""
    group.add_argument("--sglang-config", type=str, default=None, metavar="YAML",
                       help="YAML file of SGLang server options, as SGLang's own --config reads it (or, as "
                       "slime writes it, under a top-level `sglang:` section): keys are "
                       "option names (any spelling of any supported release, '-' or '_'), values their values; an option also given "
                       "as --sglang-<name> on the command line keeps the command-line value. Read at parse "
                       "time into --sglang-* flags, so the values are validated and shown by --dry-run; "
                       "framework-controlled options (model path, tp size, ports, ...) are refused.")
    group.add_argument("--prefill-num-servers", type=int, default=None,
                       help="slime's PD disaggregation: this many engines run prefill, the rest decode. "
                       "Validated and shown by --dry-run; refused at start-up (this launcher runs every "
                       "engine as one mixed pool behind sglang-router).")


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
    _add_deployment(group)
    fields = passthrough_fields(union_server_arg_fields())
    # Own flags of every option first: an alias spelling never shadows another option's flag.
    taken = set(parser._option_string_actions) | {passthrough_flags(entry)[0] for entry in fields}  # noqa: SLF001
    for entry in fields:
        add_passthrough_flag(group, entry, taken)
        taken.update(passthrough_flags(entry))
    _add_renamed(group, {entry["name"] for entry in fields})


def _add_renamed(group, known: set[str]) -> None:
    """An old option name this release lacks stays a slime flag (mapped or refused later)."""
    for old, (new, fate) in RENAMED_FIELDS.items():
        if old in known or "--sglang-" + old.replace("_", "-") in group._option_string_actions:  # noqa: SLF001
            continue  # the release still has it (as an option or an alias spelling)
        group.add_argument("--sglang-" + old.replace("_", "-"), dest="sglang_" + old, type=int, nargs="+",
                           default=None, help=f"SGLang's old --{old.replace('_', '-')} ({fate}): passed as "
                           f"--{' / --'.join(n.replace('_', '-') for n in new)}.")


def engine_tp_size(args: argparse.Namespace) -> int:
    """Tensor-parallel size of one engine: --rollout-num-gpus-per-engine / --sglang-pp-size."""
    return args.rollout_num_gpus_per_engine // getattr(args, "sglang_pp_size", 1)


def sglang_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """ServerArgs keyword arguments the user changed: {field name: value} for every passthrough
    --sglang-x whose value differs from the field's default (options of every supported release:
    `validate` refuses those the target release lacks)."""
    fields = passthrough_fields(union_server_arg_fields())
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


def _check_target_has(args: argparse.Namespace) -> None:
    """An option set that the target release lacks: one error naming it and the release."""
    target = server_args_version()
    for entry in passthrough_fields(union_server_arg_fields()):
        if target in entry["releases"] or getattr(args, "sglang_" + entry["name"], None) == entry["default"]:
            continue
        flags = " / ".join(passthrough_flags(entry))
        raise ArgumentError(f"{flags}: sglang {target} (the release this job launches) has no "
                            f"--{entry['name'].replace('_', '-')} option under any spelling; it is an option of "
                            f"sglang {', '.join(entry['releases'])}")


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


def _config_keys(fields: list[dict]) -> dict[str, dict]:
    """{YAML key: record}: every long spelling of every option, with '-' as '_' (SGLang's rule)."""
    keys = {}
    for entry in fields:
        for flag in (entry["flag"], *(entry.get("aliases") or [])):
            keys[flag[2:].replace("-", "_")] = entry
        keys[entry["name"]] = entry
    return keys


def _config_words(path: str, key: str, entry: dict, value) -> list[str]:
    """Command-line words of one YAML item, as SGLang's config merger writes them: a bool is the
    bare flag (false: none, or --no-X of an option that defaults to true), a list one word per item."""
    flag = passthrough_flags(entry)[0]
    if entry["kind"] == "bool":
        require(isinstance(value, bool), f"--sglang-config {path}: {key} must be true or false, got {value!r}")
        if value == bool(entry["default"]):
            return []
        return [flag] if value else ["--sglang-no-" + flag[len("--sglang-"):]]
    if isinstance(value, list) and entry["kind"].startswith("list_"):
        return [flag, *map(str, value)]
    if entry["kind"] == "json" and not isinstance(value, str):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def _read_config(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ArgumentError(f"--sglang-config {path}: cannot read it as YAML ({error})") from error
    require(isinstance(data, dict), f"--sglang-config {path}: expected a mapping of option: value, "
            f"got {type(data).__name__}")
    if set(data) == {"sglang"}:  # slime's layout: the options under a top-level `sglang:` section
        data = data["sglang"] or {}
        require(isinstance(data, dict), f"--sglang-config {path}: the `sglang:` section must be a mapping of "
                f"option: value, got {type(data).__name__}")
    return data


def expand_sglang_config(argv: list[str]) -> list[str]:
    """`argv` with the items of `--sglang-config YAML` inserted before it as --sglang-* words,
    SGLang's own merge: a value also given on the command line keeps the command-line one (argparse
    keeps the last), typed and checked by the flag's own parser entry. Keys must be options of the
    SGLang release that slime passes through; `--sglang-config` stays in argv (shown by the plan)."""
    paths = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--sglang-config"]
    paths += [word.split("=", 1)[1] for word in argv if word.startswith("--sglang-config=")]
    if not paths:
        return argv
    require(len(paths) == 1, f"--sglang-config given {len(paths)} times; SGLang allows one config file")
    path = paths[0]
    all_keys = _config_keys(union_server_arg_fields())
    keys = _config_keys(passthrough_fields(union_server_arg_fields()))
    words: list[str] = []
    for raw_key, value in _read_config(path).items():
        key = str(raw_key).replace("-", "_")
        require(key in all_keys, f"--sglang-config {path}: {raw_key!r} is not an option of any supported sglang "
                f"release ({server_args_version()} launches)")
        require(key in keys, f"--sglang-config {path}: {raw_key!r} is set by slime (model path, tp size, ports, "
                "seeds, memory saver, ...), not by the config file")
        words += _config_words(path, str(raw_key), keys[key], value)
    return words + list(argv)


def startup_refusals(args: argparse.Namespace, cuda_available: bool) -> list[str]:
    """--prefill-num-servers: PD disaggregation is not implemented by this launcher."""
    if args.prefill_num_servers is None:
        return []
    return [f"--prefill-num-servers {args.prefill_num_servers}: PD disaggregation (prefill and decode engines "
            "behind a PD router) is not implemented; this launcher runs every engine as one mixed pool behind "
            "sglang-router, drop the flag"]


def _check_prefill(args: argparse.Namespace) -> None:
    count = args.prefill_num_servers
    if count is None:
        return
    engines = (args.rollout_num_gpus or 0) // args.rollout_num_gpus_per_engine
    require(count >= 1, f"--prefill-num-servers must be >= 1, got {count}")
    require(count < engines, f"--prefill-num-servers {count} leaves no decode engine: --rollout-num-gpus "
            f"{args.rollout_num_gpus} / --rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine} = "
            f"{engines} engine(s)")


def validate(args: argparse.Namespace) -> list[str]:
    """--prefill-num-servers >= 1 leaves at least one decode engine; --rollout-num-gpus-per-engine divisible by --sglang-pp-size (engine tp = the quotient);
    --sglang-dp-size > 1 needs --sglang-enable-dp-attention and must divide engine tp, as must
    --sglang-ep-size; --sglang-server-concurrency >= 1; --sglang-router-port a valid port;
    --engine-start-timeout > 0; a renamed option (RENAMED_FIELDS) maps onto this release."""
    warnings: list[str] = []
    if args.sglang_config:  # its items were merged into argv by `expand_sglang_config`
        check_path_exists(args, "--sglang-config", args.sglang_config, warnings)
    _check_prefill(args)
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
    _check_target_has(args)
    return warnings
