"""SGLang `ServerArgs` values and the `sglang.launch_server` command line for one rollout engine.

Owns `sglang_server_args` (framework-controlled fields + the user's `--sglang-*` passthrough
values), `server_command` (fields -> argv, spelled as the sglang release of the passthrough table
parses them; the key never: `key_env` hands it over by environment), `engine_nnodes`, `FRAMEWORK_FIELDS`, and the `--dry-run` launch lines
(`planned_engine_processes`, `dry_run_commands`).

Framework-controlled fields always win over a passthrough value of the same field (`--sglang-host`,
`--sglang-pp-size`, `--sglang-trust-remote-code`); the rest of `EXCLUDED_FIELDS` has no
passthrough flag at all.

FP8: an FP8 `--hf-checkpoint` (a `quantization_config` in its config.json, e.g. Qwen3-30B-A3B-FP8)
needs nothing special: SGLang reads the quantization from the checkpoint while loading it.
`--sglang-quantization fp8` is only for quantizing a bf16 checkpoint online; both reach SGLang
through the passthrough unchanged.
"""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from slime.backends.sglang_utils.launch_env import memory_saver_fields
from slime.utils.arguments.sglang import engine_tp_size, server_arg_fields, server_args_version, sglang_overrides
from slime.utils.arguments.logger import is_secret_dest
from slime.utils.arguments.sglang_fields import entry_by_name, render_option
from slime.utils.security import API_KEY_ENV, REDACTED

logger = logging.getLogger(__name__)

# `python -m sglang.launch_server` with the key from the environment (`sglang_main`); tests point
# the launcher at a fake server script instead.
DEFAULT_LAUNCHER = (sys.executable, "-m", "slime.backends.sglang_utils.sglang_main")
# Fields that never go on a command line (readable by every local user): `key_env` hands the key
# to the launcher by environment, `sglang_main` sets it on SGLang's ServerArgs.
ENV_FIELDS = ("api_key", "admin_api_key")
# Fields `sglang_server_args` always sets, whatever the passthrough says.
FRAMEWORK_FIELDS = ("model_path", "tp_size", "pp_size", "host", "port", "nnodes", "node_rank", "dist_init_addr",
                    "random_seed", "base_gpu_id", "nccl_port", "enable_memory_saver", "skip_server_warmup",
                    "trust_remote_code", "api_key", "admin_api_key")
# Placeholders of the --dry-run command lines: hosts and ports are picked when an engine starts.
DRY_RUN_PORT, DRY_RUN_NCCL_PORT, DRY_RUN_DIST_PORT = 30000, 30001, 30002
# Placeholder of the --dry-run lines for the job's key (generated when the job starts).
DRY_RUN_API_KEY = "$SLIME_API_KEY"


def dist_init_port_count(args) -> int:
    """Consecutive ports to reserve at a multi-node engine's --dist-init-addr: SGLang's PortArgs
    derives its ZMQ ports from that port (port + 1 .. port + 6 + dp_rank in 0.5.23 and 0.5.15.post1),
    so the block is 30 + --sglang-dp-size ports, as slime reserves."""
    return 30 + int(getattr(args, "sglang_dp_size", 1) or 1)


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
                       nnodes: int | None = None, api_key: str | None = None) -> dict[str, Any]:
    """ServerArgs field values for engine `engine_rank` of `num_engines` (its process on `node_rank`).

    Returns {field: value}: the framework fields, then every user-changed `--sglang-*` value
    (`sglang_overrides(args)`: dp size, DP attention, ep size, mem fraction, quantization, ...)
    that is not one of them. Framework fields:
    model_path = --hf-checkpoint, tp_size = engine_tp_size(args), pp_size = --sglang-pp-size,
    random_seed = --seed + engine_rank, enable_memory_saver = --offload-rollout (on with --colocate
    / --offload; then also cuda_graph_backend_prefill "disabled", see `launch_env`), skip_server_warmup and trust_remote_code True, plus host, port, nccl_port,
    base_gpu_id (first GPU of the engine among the visible ones on this node), api_key = `api_key`
    (the job's key: every endpoint but /health* then needs it) and admin_api_key None (one key
    for every endpoint; a separate admin key would lock the job's own weight updates out). `nnodes` None means
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
        "api_key": api_key, "admin_api_key": None,
    }
    framework.update(memory_saver_fields(framework))
    overrides = sglang_overrides(args)
    for name in sorted(set(overrides) & set(framework)):
        if overrides[name] != framework[name]:
            shown = [REDACTED if is_secret_dest(name) and v is not None else v for v in (overrides[name], framework[name])]
            logger.warning("--sglang-%s %r is ignored: the framework sets %s=%r for engine %d",
                           name.replace("_", "-"), shown[0], name, shown[1], engine_rank)
    return {**framework, **{name: value for name, value in overrides.items() if name not in framework}}


def server_command(fields: dict[str, Any], launcher: tuple[str, ...] | list[str] = DEFAULT_LAUNCHER) -> list[str]:
    """`launcher` + the option of each field, in the order given, as SGLang's parser spells and
    reads it (`render_option`: True -> bare flag, False / None -> omitted, lists -> one word per
    item, json options -> one JSON word), except `ENV_FIELDS` (the key: `key_env`). Every name
    must be an option of the sglang release the passthrough lists (`server_arg_fields()`); raises
    ValueError naming the others and the release.
    """
    table = entry_by_name(server_arg_fields())
    unknown = sorted(set(fields) - set(table))
    if unknown:
        raise ValueError(f"not options of sglang {server_args_version()}'s launch_server: {', '.join(unknown)}")
    if fields.get("admin_api_key"):
        raise ValueError("admin_api_key is never set: the job's one key (api_key) opens every endpoint")
    argv = list(launcher)
    for name, value in fields.items():
        if name not in ENV_FIELDS:
            argv += render_option(table[name], value)
    return argv


def key_env(fields: dict[str, Any]) -> dict[str, str]:
    """The environment that carries the engine's key to `sglang_main` (`$SLIME_API_KEY`; empty when
    the engine has no key, which `sglang_main` reads as none)."""
    return {API_KEY_ENV: fields.get("api_key") or ""}


@dataclass(frozen=True)
class EngineProcess:
    """One SGLang process of an engine: engine `engine_rank`'s part on its node `node_rank` of
    `nnodes`, on GPUs base_gpu_id.. of that node (the placement's node `node`)."""

    engine_rank: int
    node_rank: int
    nnodes: int
    node: int
    base_gpu_id: int


def planned_engine_processes(args) -> list[EngineProcess]:
    """The engine processes the placement plan starts (what `--dry-run` shows): rollout GPUs from
    0 when colocated, else after the trainer's; engine i on the next --rollout-num-gpus-per-engine
    of them; one process per node the engine spans; node of global GPU g = g // --num-gpus-per-node."""
    per_engine, per_node = args.rollout_num_gpus_per_engine, args.num_gpus_per_node
    actor = args.actor_num_nodes * args.actor_num_gpus_per_node
    rollout = args.rollout_num_gpus if args.rollout_num_gpus is not None else (actor if args.colocate else 0)
    first = 0 if args.colocate else actor
    nnodes = engine_nnodes(args)
    out = []
    for rank in range(rollout // per_engine):
        for node_rank in range(nnodes):
            gpu = first + rank * per_engine + node_rank * (per_engine // nnodes)
            out.append(EngineProcess(rank, node_rank, nnodes, gpu // per_node, gpu % per_node))
    return out


def dry_run_commands(args) -> list[str]:
    """`sglang command: <argv>` for every planned engine process, hosts and ports as placeholders
    (`node<N>`, DRY_RUN_*; the key, never on the line, reaches `sglang_main` as $SLIME_API_KEY),
    plus one note line saying so; empty without engines."""
    processes = planned_engine_processes(args)
    num_engines = len({p.engine_rank for p in processes})
    lines = []
    for p in processes:
        head = next(q for q in processes if q.engine_rank == p.engine_rank and q.node_rank == 0)
        fields = sglang_server_args(
            args, engine_rank=p.engine_rank, num_engines=num_engines, host=f"node{p.node}", port=DRY_RUN_PORT,
            nccl_port=DRY_RUN_NCCL_PORT, dist_init_addr=f"node{head.node}:{DRY_RUN_DIST_PORT}",
            base_gpu_id=p.base_gpu_id, node_rank=p.node_rank, nnodes=p.nnodes, api_key=DRY_RUN_API_KEY)
        lines.append("sglang command: " + shlex.join(server_command(fields)))
    if lines:
        lines.insert(0, f"# engine launch lines for sglang {server_args_version()}; hosts node<N> and ports "
                        f"{DRY_RUN_PORT}/{DRY_RUN_NCCL_PORT}/{DRY_RUN_DIST_PORT} are placeholders picked at "
                        f"start; the job's key reaches each engine as {DRY_RUN_API_KEY}, never on its command line")
    return lines
