"""SGLang `ServerArgs` values and the `sglang.launch_server` command line for one rollout engine.

Owns `sglang_server_args` (framework-controlled fields + the user's `--sglang-*` passthrough
values), `server_command` (fields -> argv), `engine_nnodes` and `FRAMEWORK_FIELDS`.

Framework-controlled fields always win over a passthrough value of the same field (`--sglang-host`,
`--sglang-pp-size`, `--sglang-trust-remote-code`); the rest of `EXCLUDED_FIELDS` has no
passthrough flag at all.

FP8: an FP8 `--hf-checkpoint` (a `quantization_config` in its config.json, e.g. Qwen3-30B-A3B-FP8)
needs nothing special: SGLang reads the quantization from the checkpoint while loading it.
`--sglang-quantization fp8` is only for quantizing a bf16 checkpoint online; both reach SGLang
through the passthrough unchanged.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from slime.utils.arguments.sglang import engine_tp_size, server_arg_fields, sglang_overrides

logger = logging.getLogger(__name__)

# `python -m sglang.launch_server`; tests point the launcher at a fake server script instead.
DEFAULT_LAUNCHER = (sys.executable, "-m", "sglang.launch_server")
# Fields `sglang_server_args` always sets, whatever the passthrough says.
FRAMEWORK_FIELDS = ("model_path", "tp_size", "pp_size", "host", "port", "nnodes", "node_rank", "dist_init_addr",
                    "random_seed", "base_gpu_id", "nccl_port", "enable_memory_saver", "skip_server_warmup",
                    "trust_remote_code")
# Fields whose SGLang (0.5.10) option takes its value differently from what the annotation
# suggests: name -> renderer of a set value into the option's arguments.
_OPTION_RENDERERS = {
    # type=json_list_type: one JSON list argument, not nargs
    "remote_instance_weight_loader_send_weights_group_ports": lambda value: [json.dumps(list(value))],
    "forward_hooks": lambda value: [value if isinstance(value, str) else json.dumps(value)],
    # a bool field whose option takes a value (type=str)
    "debug_tensor_dump_inject": lambda value: [str(value)],
}


def engine_nnodes(args) -> int:
    """Nodes one engine spans: 1 when --rollout-num-gpus-per-engine <= --num-gpus-per-node, else
    the quotient (which must be whole)."""
    per_engine, per_node = args.rollout_num_gpus_per_engine, args.num_gpus_per_node
    if per_engine <= per_node:
        return 1
    if per_engine % per_node:
        raise ValueError(f"--rollout-num-gpus-per-engine {per_engine} spans several nodes but is not a "
                         f"multiple of --num-gpus-per-node {per_node}")
    return per_engine // per_node


def _check_topology(args, engine_rank: int, num_engines: int, node_rank: int, nnodes: int,
                    dist_init_addr: str | None) -> None:
    if not 0 <= engine_rank < num_engines:
        raise ValueError(f"engine_rank {engine_rank} is outside [0, {num_engines}) engines")
    expected = engine_nnodes(args)
    if nnodes != expected:
        raise ValueError(f"nnodes {nnodes} disagrees with --rollout-num-gpus-per-engine "
                         f"{args.rollout_num_gpus_per_engine} / --num-gpus-per-node {args.num_gpus_per_node} "
                         f"= {expected} node(s) per engine")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank {node_rank} is outside [0, {nnodes}) nodes of engine {engine_rank}")
    if nnodes > 1 and not dist_init_addr:
        raise ValueError(f"engine {engine_rank} spans {nnodes} nodes: dist_init_addr (host:port of its "
                         "node-rank-0 process) is required")


def sglang_server_args(args, *, engine_rank: int, num_engines: int, host: str, port: int, nccl_port: int,
                       dist_init_addr: str | None, base_gpu_id: int, node_rank: int = 0,
                       nnodes: int | None = None) -> dict[str, Any]:
    """ServerArgs field values for engine `engine_rank` of `num_engines` (its process on `node_rank`).

    Returns {field: value}: the framework fields, then every user-changed `--sglang-*` value
    (`sglang_overrides(args)`: dp size, DP attention, ep size, mem fraction, quantization, ...)
    that is not one of them. Framework fields:
    model_path = --hf-checkpoint, tp_size = engine_tp_size(args), pp_size = --sglang-pp-size,
    random_seed = --seed + engine_rank, enable_memory_saver = --offload-rollout (on with --colocate
    / --offload), skip_server_warmup and trust_remote_code True, plus host, port, nccl_port,
    base_gpu_id (first GPU of the engine among the visible ones on this node). `nnodes` None means
    `engine_nnodes(args)`; engines spanning several nodes also get node_rank and dist_init_addr
    (required then). Raises ValueError naming the flags on an inconsistent topology.
    """
    nnodes = engine_nnodes(args) if nnodes is None else nnodes
    _check_topology(args, engine_rank, num_engines, node_rank, nnodes, dist_init_addr)
    framework = {
        "model_path": args.hf_checkpoint, "tp_size": engine_tp_size(args),
        "pp_size": getattr(args, "sglang_pp_size", 1) or 1, "host": host, "port": port,
        "nnodes": nnodes, "node_rank": node_rank, "dist_init_addr": dist_init_addr if nnodes > 1 else None,
        "random_seed": args.seed + engine_rank, "base_gpu_id": base_gpu_id, "nccl_port": nccl_port,
        "enable_memory_saver": bool(args.offload_rollout), "skip_server_warmup": True, "trust_remote_code": True,
    }
    overrides = sglang_overrides(args)
    for name in sorted(set(overrides) & set(framework)):
        if overrides[name] != framework[name]:
            logger.warning("--sglang-%s %r is ignored: the framework sets %s=%r for engine %d",
                           name.replace("_", "-"), overrides[name], name, framework[name], engine_rank)
    return {**framework, **{name: value for name, value in overrides.items() if name not in framework}}


def _render(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is None or value is False:  # None: SGLang's default; False: a store_true flag left off
        return []
    if name in _OPTION_RENDERERS:
        return [flag, *_OPTION_RENDERERS[name](value)]
    if value is True:
        return [flag]
    if isinstance(value, (list, tuple)):
        return [flag, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)] if value else []
    if isinstance(value, dict):
        return [flag, json.dumps(value, sort_keys=True)]
    return [flag, str(value)]


def server_command(fields: dict[str, Any], launcher: tuple[str, ...] | list[str] = DEFAULT_LAUNCHER) -> list[str]:
    """`launcher` + `--field-name value` for each field, in the order given.

    True -> bare flag, False / None -> omitted (SGLang's store_true default), list -> flag followed
    by its items (nargs), dict -> one JSON argument, anything else -> str(value); the few options
    of `_OPTION_RENDERERS` take theirs as SGLang parses them. Every name must
    be a field of SGLang's ServerArgs (`server_arg_fields()`); raises ValueError naming the others.
    """
    known = {entry["name"] for entry in server_arg_fields()}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"not SGLang ServerArgs fields: {', '.join(unknown)}")
    argv = list(launcher)
    for name, value in fields.items():
        argv += _render(name, value)
    return argv
