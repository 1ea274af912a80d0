"""MoE routing replay in the trainer (`--use-rollout-routing-replay`, `--use-routing-replay`).

Built on megatron-core's own mechanism (0.16+, `transformer/moe/router_replay.py`): with
`TransformerConfig.moe_enable_routing_replay` every `TopKRouter` owns a `RouterReplay` whose
action decides the top-k: RECORD (route, keep the indices), REPLAY_FORWARD (take the indices set
with `set_target_indices`, gather their scores) or none (route normally). We drive the instances
of one model directly, found by walking its modules, not megatron's class-wide list, which also
holds the routers of every other model built in the process (the reference model's).

Routing data is one int array per sample, [rows, num_layers, topk] expert ids, row t the token at
position t of prompt + response; SGLang's `routed_experts` have len(tokens) - 1 rows (the last
token is never fed to the engine), recorded ones cover the padded sample. `routing_row` lays the
samples of a micro-batch out exactly as `packing.pack_sequences` lays out their tokens (CP zigzag
chunks, end padding); positions without data (the last token, padding) route to experts 0..k-1,
which only pads the computation: no response log-prob reads them. Under sequence parallelism the
router sees only this TP rank's contiguous share of the row (`sequence_parallel_share`).
"""

from __future__ import annotations

import numpy as np
import torch

from slime.backends.megatron_utils import collectives
from slime.backends.megatron_utils.packing import cp_padded_length, zigzag_positions

REPLAY_KEY = "replay_routed_experts"  # rollout_data key of the per-sample routing the trainer replays


def model_routers(model) -> list[tuple[int, object]]:
    """(0-based global layer index, TopKRouter) of every router of `model` (this PP stage) that
    has a RouterReplay."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [(m.layer_number - 1, m) for m in model.modules()
            if isinstance(m, TopKRouter) and getattr(m, "router_replay", None) is not None]


def _replay_where_called(router, inputs) -> None:
    """Forward pre-hook: a replaying router that runs inside autograd's backward (activation
    recompute) takes the next indices of the backward queue (REPLAY_BACKWARD, first in first out,
    the order the schedule runs backward passes in), otherwise the current forward's."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    replay = router.router_replay
    if replay.router_replay_action in (RouterReplayAction.REPLAY_FORWARD, RouterReplayAction.REPLAY_BACKWARD):
        in_backward = torch._C._current_graph_task_id() != -1
        replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD if in_backward
                                        else RouterReplayAction.REPLAY_FORWARD)


def reset(model) -> None:
    """Before a schedule run: empty every router's indices and backward queue."""
    for _, router in model_routers(model):
        router.router_replay.clear_indices()


def set_replay(model, routing: torch.Tensor | None) -> None:
    """Before a forward: every router of `model` replays `routing` [tokens, num_layers, topk]
    (this rank's tokens, in the order the router sees them), or routes itself when None. The
    indices also join the router's backward queue for a recompute of this forward."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    for layer, router in model_routers(model):
        replay = router.router_replay
        if routing is None:
            replay.clear_router_replay_action()
            continue
        if getattr(router, "_slime_replay_hook", None) is None:
            router._slime_replay_hook = router.register_forward_pre_hook(_replay_where_called)
        replay.set_target_indices(routing[:, layer].to(torch.long))
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)


def set_record(model) -> None:
    """Before a forward: every router of `model` routes itself and keeps its top-k indices."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    for _, router in model_routers(model):
        router.router_replay.clear_indices()
        router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)


def recorded(model, num_layers: int, topk: int) -> torch.Tensor:
    """After a recording forward: [tokens, num_layers, topk] indices this rank's routers chose
    (layers of other pipeline stages, and dense layers, stay filler)."""
    routers = model_routers(model)
    tokens = routers[0][1].router_replay.get_recorded_indices().shape[0]
    out = _filler(tokens, num_layers, topk)
    for layer, router in routers:
        out[:, layer] = router.router_replay.get_recorded_indices().to(torch.int32).cpu()
    return out


def _filler(rows: int, num_layers: int, topk: int) -> torch.Tensor:
    return torch.arange(topk, dtype=torch.int32).expand(rows, num_layers, topk).clone()


def routing_row(routed: list, total_lengths: list[int], row_length: int, *, num_layers: int, topk: int,
                cp_rank: int = 0, cp_size: int = 1) -> torch.Tensor:
    """The routing of a packed row [row_length, num_layers, topk], aligned with its tokens.

    `routed[i]`: sample i's routing, [rows, num_layers, topk] (or flat), rows <= its padded length."""
    parts, used = [], 0
    for arr, length in zip(routed, total_lengths):
        padded = cp_padded_length(length, cp_size)
        values = torch.as_tensor(np.asarray(arr, dtype=np.int32)).reshape(-1, num_layers, topk)
        if not length - 1 <= values.shape[0] <= padded:
            raise ValueError(f"routed experts have {values.shape[0]} rows for a sample of {length} tokens "
                             f"(expected at least its {length - 1} fed tokens)")
        full = _filler(padded, num_layers, topk)
        full[:values.shape[0]] = values
        positions = zigzag_positions(padded, cp_rank, cp_size)
        parts.append(full[positions])
        used += len(positions)
    if used > row_length:
        raise ValueError(f"the samples need {used} row positions, the row has {row_length}")
    parts.append(_filler(row_length - used, num_layers, topk))
    return torch.cat(parts)


def sequence_parallel_share(row: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The contiguous 1/tp of a row's tokens that TP rank `tp_rank` holds under sequence parallelism."""
    if row.shape[0] % tp_size:
        raise ValueError(f"a row of {row.shape[0]} tokens does not split over {tp_size} TP ranks")
    share = row.shape[0] // tp_size
    return row[tp_rank * share:(tp_rank + 1) * share]


def unpack_row(row: torch.Tensor, total_lengths: list[int], full: dict, sample_ids: list[int], *,
               cp_rank: int = 0, cp_size: int = 1) -> None:
    """Inverse of `routing_row` for this CP rank: write each sample's positions of `row` into
    `full[sample_id]` ([padded length, layers, topk]; created with filler when missing)."""
    offset = 0
    for sid, length in zip(sample_ids, total_lengths):
        padded = cp_padded_length(length, cp_size)
        positions = zigzag_positions(padded, cp_rank, cp_size)
        if sid not in full:
            full[sid] = _filler(padded, row.shape[1], row.shape[2])
        full[sid][positions] = row[offset:offset + len(positions)]
        offset += len(positions)


def attach(micro_batches: list, rollout_data: dict, mode: str | None, *, num_layers: int, topk: int,
           cp_rank: int = 0, cp_size: int = 1, tp_rank: int = 0, sp_size: int = 1) -> None:
    """Set each micro-batch's routing mode and, for "replay", this rank's routing from
    `rollout_data[REPLAY_KEY]` (sp_size: the TP size under sequence parallelism, else 1)."""
    for mb in micro_batches:
        mb.routing_mode = mode
        if mode != "replay":
            continue
        routed = [rollout_data[REPLAY_KEY][i] for i in mb.packed.sample_ids]
        row = routing_row(routed, mb.packed.total_lengths, mb.packed.num_tokens, num_layers=num_layers,
                          topk=topk, cp_rank=cp_rank, cp_size=cp_size)
        mb.routing = sequence_parallel_share(row, tp_rank, sp_size).to(mb.packed.tokens.device)


def collect(micro_batches: list, *, cp_rank: int = 0, cp_size: int = 1, sp_group=None) -> dict:
    """After a recording pass: {sample id: [padded length, layers, topk]} routing this rank chose
    (its CP positions and its stage's layers); `sp_group` gathers the TP shares under SP."""
    import torch.distributed as dist

    full: dict = {}
    for mb in micro_batches:
        row = mb.recorded
        if sp_group is not None and dist.get_world_size(sp_group) > 1:
            row = torch.cat(collectives.all_gather(collectives.to_device(row), group=sp_group))
        unpack_row(row, mb.packed.total_lengths, full, mb.packed.sample_ids, cp_rank=cp_rank, cp_size=cp_size)
    return full


def keep_recorded(rollout_data: dict, micro_batches: list, *, cp_rank: int = 0, cp_size: int = 1,
                  sp_group=None) -> None:
    """The routing recorded by a pass over `micro_batches`, whole per sample, as
    rollout_data[REPLAY_KEY] (None for samples this rank did not run) for the passes that replay it."""
    full = collect(micro_batches, cp_rank=cp_rank, cp_size=cp_size, sp_group=sp_group)
    rollout_data[REPLAY_KEY] = [full.get(i) for i in range(len(rollout_data["tokens"]))]


def old_policy_routing(args, rollout_data: dict) -> str | None:
    """The routing mode of the old-policy pass: "replay" the engines' routed experts
    (--use-rollout-routing-replay, R3; they become rollout_data[REPLAY_KEY]), "record" the
    trainer's own for the training passes (--use-routing-replay), else None."""
    if args.use_rollout_routing_replay:
        if "rollout_routed_experts" not in rollout_data:
            raise ValueError("--use-rollout-routing-replay: the rollout data has no rollout_routed_experts "
                             "(every sample needs the engine's routed experts)")
        rollout_data[REPLAY_KEY] = rollout_data["rollout_routed_experts"]
        return "replay"
    return "record" if args.use_routing_replay else None
