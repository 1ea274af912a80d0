"""GPU placement and batch arithmetic for the ``--dry-run`` plan.

Placement follows slime's single placement group (one GPU per bundle, sorted by node and GPU
id): colocated, trainer and engines share the first ``max(actor, rollout)`` GPUs; disaggregated,
the actor's GPUs come first, then the critic's (``--advantage-estimator ppo``), then the rollout GPUs. Global GPU id ``g`` lives on node
``g // --num-gpus-per-node``.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field

from slime.utils.arguments.critic import critic_world_size


@dataclass
class Engine:
    """One SGLang engine: its global GPU ids and parallel sizes."""

    index: int
    gpus: list[int]
    tp: int
    dp: int
    ep: int


@dataclass
class Placement:
    """Which global GPU ids hold trainer ranks and each rollout engine."""

    colocated: bool
    total_gpus: int
    gpus_per_node: int
    trainer_gpus: list[int]
    engines: list[Engine] = field(default_factory=list)
    critic_gpus: list[int] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        """Nodes spanned by the placement group."""
        return -(-self.total_gpus // self.gpus_per_node)

    def node_of(self, gpu: int) -> int:
        """Node index of global GPU id ``gpu``."""
        return gpu // self.gpus_per_node


def placement_from_args(args: Namespace) -> Placement:
    """Place trainer ranks and engines. Engine tp = --rollout-num-gpus-per-engine / --sglang-pp-size;
    DP-attention size from --sglang-dp-size when --sglang-enable-dp-attention; EP from --sglang-ep-size."""
    actor = args.actor_num_nodes * args.actor_num_gpus_per_node
    rollout = args.rollout_num_gpus
    if rollout is None:
        rollout = actor if args.colocate else 0
    per_engine = args.rollout_num_gpus_per_engine or 1
    if rollout % per_engine:
        raise ValueError(f"--rollout-num-gpus {rollout} is not divisible by --rollout-num-gpus-per-engine {per_engine}")
    critic = critic_world_size(args)
    first_rollout_gpu = 0 if args.colocate else actor + critic
    total = max(actor, rollout) if args.colocate else actor + critic + rollout
    engine_pp = getattr(args, "sglang_pp_size", None) or 1
    dp = (getattr(args, "sglang_dp_size", None) or 1) if getattr(args, "sglang_enable_dp_attention", False) else 1
    ep = getattr(args, "sglang_ep_size", None) or 1
    engines = [Engine(i, list(range(first_rollout_gpu + i * per_engine, first_rollout_gpu + (i + 1) * per_engine)),
                      per_engine // engine_pp, dp, ep)
               for i in range(rollout // per_engine)]
    return Placement(bool(args.colocate), total, args.num_gpus_per_node, list(range(actor)), engines,
                     list(range(actor, actor + critic)))


@dataclass
class BatchPlan:
    """Per-rollout and per-step sample counts."""

    prompts_per_rollout: int
    samples_per_rollout: int
    global_batch_size: int
    steps_per_rollout: int
    samples_per_dp_rank: int
    micro_batches: int  # per step per DP rank (static), or the worst-case estimate (dynamic)
    dynamic: bool
    max_tokens_per_gpu: int | None
    max_seq_len: int
    over_sampling_batch_size: int | None
    notes: list[str] = field(default_factory=list)


def batch_from_args(args: Namespace, dp: int, cp: int) -> BatchPlan:
    """Samples per rollout = --rollout-batch-size * --n-samples-per-prompt; steps per rollout =
    --num-steps-per-rollout or samples // --global-batch-size; micro-batches per step per DP rank =
    GBS / (DP * MBS), or with dynamic batching at most ceil(GBS/DP * max_seq_len / (max_tokens * CP))."""
    if not args.rollout_batch_size:
        raise ValueError("--dry-run plan needs --rollout-batch-size")
    samples = args.rollout_batch_size * (args.n_samples_per_prompt or 1)
    notes = []
    steps = getattr(args, "num_steps_per_rollout", None)
    gbs = args.global_batch_size or (samples // steps if steps else samples)
    steps = steps or max(1, samples // gbs)
    if samples % gbs:
        notes.append(f"samples per rollout {samples} is not a multiple of --global-batch-size {gbs}")
    per_dp = gbs // dp
    prompt = getattr(args, "rollout_max_prompt_len", None) or 0
    max_seq = getattr(args, "rollout_max_context_len", None) or prompt + (args.rollout_max_response_len or 0)
    dynamic = bool(getattr(args, "use_dynamic_batch_size", False))
    if dynamic:
        budget = (args.max_tokens_per_gpu or 1) * cp
        micro = -(-(per_dp * max_seq) // budget) if max_seq else 0
        if not prompt and not getattr(args, "rollout_max_context_len", None):
            notes.append("max sequence length counts the response only "
                         "(set --rollout-max-prompt-len to include prompts)")
    else:
        micro = max(1, per_dp // (args.micro_batch_size or 1))
    return BatchPlan(args.rollout_batch_size, samples, gbs, steps, per_dp, micro, dynamic,
                     getattr(args, "max_tokens_per_gpu", None), max_seq,
                     getattr(args, "over_sampling_batch_size", None), notes)
