"""How a rank's trainer splits a rollout: its data-parallel share of each global batch, and that
share packed into micro-batches (fixed `--micro-batch-size` or token-balanced by
`--max-tokens-per-gpu`, the same count on every data-parallel rank), padded as tensor, pipeline,
context and expert parallelism need. A mixin of `MegatronTrainer` (and so of the critic).
"""

from __future__ import annotations

import math

import torch

from slime.backends.megatron_utils import collectives, routing_replay
from slime.backends.megatron_utils import train_step as ts
from slime.backends.megatron_utils.packing import local_row_length
from slime.backends.megatron_utils.parallel import megatron_parallel_state as _mpu
from slime.utils.seqlen_balancing import dynamic_microbatches, split_for_data_parallel


# FP8 GEMMs (Transformer Engine) need the tokens of each rank's GEMM in multiples of 16 (delayed /
# tensorwise scaling; 32 for MXFP8): rows are padded to 128 tokens per rank, slime's TP x 128
FP8_TOKENS_PER_RANK_MULTIPLE = 128


def row_pad_multiple(tp: int, sequence_parallel: bool, fp8: bool, multiplier: int | None = None) -> int:
    """The multiple each micro-batch row (this CP rank's) is padded to: TP under sequence parallel
    (the row is split over TP ranks), times FP8_TOKENS_PER_RANK_MULTIPLE with FP8 (--fp8-format),
    and a multiple of TP x --data-pad-size-multiplier when given (slime's padding)."""
    split = tp if sequence_parallel else 1
    pad = split * FP8_TOKENS_PER_RANK_MULTIPLE if fp8 else split
    return math.lcm(pad, tp * multiplier) if multiplier else pad


class DataSplitMixin:
    """Data split of `MegatronTrainer`; needs `self.args` and `self.state` (the train state)."""

    def step_indices(self, rollout_data: dict) -> list[list[int]]:
        """Per global batch, the sample indices this data-parallel rank trains on."""
        n, gbs = len(rollout_data["tokens"]), self.args.global_batch_size
        if n % gbs:
            raise ValueError(f"rollout has {n} samples, not a multiple of --global-batch-size {gbs}")
        mpu = _mpu()
        dp_rank, dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        lengths = [len(t) for t in rollout_data["tokens"]]
        out = []
        for start in range(0, n, gbs):
            parts = split_for_data_parallel(lengths[start:start + gbs], dp_size, self.args.balance_data)
            out.append([start + i for i in parts[dp_rank]])
        return out

    def _micro_batches(self, rollout_data: dict, indices: list[int], max_tokens: int | None, keys=(),
                       routing: str | None = None) -> list:
        args = self.args
        lengths = [len(rollout_data["tokens"][i]) for i in indices]
        mpu = _mpu()
        cp = dict(cp_rank=mpu.get_context_parallel_rank(), cp_size=mpu.get_context_parallel_world_size())
        if args.use_dynamic_batch_size:  # --max-tokens-per-gpu counts each GPU's share of a CP split
            groups = self._agreed_microbatches(lengths, max_tokens * cp["cp_size"])
        else:
            size = args.micro_batch_size
            groups = [list(range(i, min(i + size, len(indices)))) for i in range(0, len(indices), size)]
        tp, sp = mpu.get_tensor_model_parallel_world_size(), self.state.config.sequence_parallel
        pad = row_pad_multiple(tp, sp, bool(getattr(args, "fp8_format", None)), args.data_pad_size_multiplier)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        groups = [[indices[j] for j in g] for g in groups if g]
        lengths = self._padded_lengths(rollout_data, groups, cp["cp_size"])
        mbs = [ts.build_micro_batch(rollout_data, g, pad_to=pad, device=device, keys=keys, min_length=n, **cp)
               for g, n in zip(groups, lengths)]
        if args.use_routing_replay:  # routers always told what to do: a replay must not outlive its pass
            routing_replay.attach(mbs, rollout_data, routing or "own", num_layers=args.num_layers,
                                  topk=args.moe_router_topk, tp_rank=mpu.get_tensor_model_parallel_rank(),
                                  sp_size=tp if sp else 1, **cp)
        return mbs

    @staticmethod
    def _agreed_microbatches(lengths: list[int], max_tokens: int) -> list[list[int]]:
        """Token-balanced micro-batches, the same count on every data-parallel rank (the schedule's
        collectives pair up micro-batch by micro-batch). Packing with a forced count may need one
        more micro-batch on some rank, so ranks agree on (max, -min) until both are equal."""
        num = 1
        while True:
            groups = dynamic_microbatches(lengths, max_tokens, num=num)
            counts = collectives.device_tensor([len(groups), -len(groups)])
            most, neg_least = collectives.all_reduce(counts, "max", group=_mpu().get_data_parallel_group()).tolist()
            if most == -neg_least:
                return groups
            num = most

    def _padded_lengths(self, rollout_data: dict, groups: list[list[int]], cp_size: int) -> list[int]:
        """Row length of each micro-batch (this CP rank's share). Pipeline stages exchange
        fixed-shape activations (pad all to the longest); the allgather MoE dispatcher gathers
        equal-sized token blocks from every expert-parallel rank (pad micro-batch j to its longest
        over data parallel)."""
        mpu = _mpu()
        lengths = [local_row_length([len(rollout_data["tokens"][i]) for i in g], cp_size) for g in groups]
        if mpu.get_expert_model_parallel_world_size() > 1 and mpu.get_data_parallel_world_size() > 1:
            lengths = collectives.all_reduce(collectives.device_tensor(lengths), "max",
                                             group=mpu.get_data_parallel_group()).tolist()
        if mpu.get_pipeline_model_parallel_world_size() > 1:
            lengths = [max(lengths)] * len(lengths)
        return lengths
