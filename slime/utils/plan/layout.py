"""Trainer parallel layout for the ``--dry-run`` plan: group sizes and the rank lists of each
process group, computed the way megatron-core builds them.

megatron-core 0.16 (``parallel_state.initialize_model_parallel``) uses the default order
``"tp-cp-ep-dp-pp"``: the first name varies fastest over global ranks. It builds two generators
over the same ranks:

- dense side: sizes tp=TP, cp=CP, ep=1, dp=world/(TP*PP*CP), pp=PP -> TP, CP, DP, PP groups;
- expert side: sizes tp=ETP, ep=EP, dp=world/(PP*EP*ETP), pp=PP, cp=1 -> ETP, EP, expert-DP.

A group of kind ``k`` holds the ranks that differ only in coordinate ``k``. This module
re-derives those lists (it does not import megatron); a test checks them against megatron's
``RankGenerator``.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field
from itertools import product

MEGATRON_ORDER = ("tp", "cp", "ep", "dp", "pp")


def rank_groups(sizes: dict[str, int], kind: str) -> list[list[int]]:
    """All process groups of ``kind`` ("tp", "dp", "dp-cp", ...) for the given sizes.

    ``sizes`` maps each of ``MEGATRON_ORDER`` to its size; rank = sum(coord[k] * stride[k]) with
    strides the running product of sizes in ``MEGATRON_ORDER``. Groups are ordered like megatron's:
    by the remaining coordinates, the earliest name varying fastest.
    """
    wanted = kind.split("-")
    strides, stride = {}, 1
    for name in MEGATRON_ORDER:
        strides[name] = stride
        stride *= sizes[name]
    others = [n for n in MEGATRON_ORDER if n not in wanted]
    members = [n for n in MEGATRON_ORDER if n in wanted]
    groups = []
    # product() varies its last argument fastest; reverse so the earliest name varies fastest.
    for outer in product(*(range(sizes[n]) for n in reversed(others))):
        base = sum(c * strides[n] for c, n in zip(outer, reversed(others)))
        group = [base + sum(c * strides[n] for c, n in zip(inner, reversed(members)))
                 for inner in product(*(range(sizes[n]) for n in reversed(members)))]
        groups.append(group)
    return groups


@dataclass
class ParallelLayout:
    """Trainer parallel sizes and the first few rank lists of each group kind."""

    world_size: int
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int
    expert_dp: int
    sequence_parallel: bool
    groups: dict[str, list[list[int]]] = field(default_factory=dict)
    num_groups: dict[str, int] = field(default_factory=dict)


def _checked_div(world: int, denom: int, what: str) -> int:
    if denom <= 0 or world % denom:
        raise ValueError(f"trainer world size {world} is not divisible by {what} = {denom}")
    return world // denom


def layout_from_args(args: Namespace, max_groups: int = 4) -> ParallelLayout:
    """Resolve DP and expert-DP from the world size and list up to ``max_groups`` groups per kind.

    World size = --actor-num-nodes * --actor-num-gpus-per-node. Raises ValueError when the world
    size is not divisible by TP*PP*CP or PP*EP*ETP (megatron's own condition).
    """
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    tp = args.tensor_model_parallel_size or 1
    pp = args.pipeline_model_parallel_size or 1
    cp = args.context_parallel_size or 1
    ep = args.expert_model_parallel_size or 1
    etp = args.expert_tensor_parallel_size or tp
    dp = _checked_div(world, tp * pp * cp, "TP*PP*CP")
    edp = _checked_div(world, pp * ep * etp, "PP*EP*ETP")
    layout = ParallelLayout(world, tp, pp, cp, dp, ep, etp, edp, bool(args.sequence_parallel))
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    expert = {"tp": etp, "cp": 1, "ep": ep, "dp": edp, "pp": pp}
    kinds = {"TP": (dense, "tp"), "CP": (dense, "cp"), "DP": (dense, "dp"), "DP-CP": (dense, "dp-cp"),
             "PP": (dense, "pp"), "EP": (expert, "ep"), "ETP": (expert, "tp"), "EDP": (expert, "dp")}
    for label, (sizes, kind) in kinds.items():
        groups = rank_groups(sizes, kind)
        layout.num_groups[label] = len(groups)
        layout.groups[label] = groups[:max_groups]
    return layout


def stage_layer_ranges(num_layers: int, pp: int) -> list[range]:
    """Layers held by each pipeline stage: an even split (megatron requires divisibility unless
    uneven-PP flags are used; a remainder goes to the first stages here)."""
    base, extra = divmod(num_layers, pp)
    ranges, start = [], 0
    for stage in range(pp):
        count = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + count))
        start += count
    return ranges
