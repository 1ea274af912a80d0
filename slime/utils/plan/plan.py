"""The ``--dry-run`` plan: one dataclass tree built from parsed arguments.

:func:`build_plan` is pure (no torch, megatron or ray): it reads the argument namespace and
returns placement, parallel layout, batch arithmetic, trainer and engine memory, host RAM and
the parser's warnings. Secrets (``--wandb-key``) are never copied into the plan.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field

from slime.utils.arguments.critic import critic_view, uses_critic
from slime.utils.plan.colocation import Phase, colocated_timeline
from slime.utils.plan.engine import EngineMemory, engine_memory
from slime.utils.plan.layout import ParallelLayout, layout_from_args
from slime.utils.plan.memory import HostMemory, TrainerMemory, host_memory, trainer_memory
from slime.utils.plan.model import ModelShape, ParamSplit, active_params, shape_from_args, total_params
from slime.utils.plan.placement import BatchPlan, Placement, batch_from_args, placement_from_args


@dataclass
class CriticPlan:
    """The critic group of ``--advantage-estimator ppo``: its GPUs, parallel layout and memory per
    GPU (the actor's model shape: the output layer is counted at vocabulary size, an upper bound
    for its one-output value head)."""

    gpus: list[int]
    layout: ParallelLayout
    memory: TrainerMemory


def critic_plan(args: Namespace, shape: ModelShape, gpus: list[int]) -> CriticPlan | None:
    """The critic's part of the plan, or None without a critic."""
    if not uses_critic(args):
        return None
    view = critic_view(args)
    layout = layout_from_args(view)
    return CriticPlan(gpus, layout, trainer_memory(view, shape, layout))


@dataclass
class Plan:
    """Everything ``--dry-run`` prints; see ``docs/dry-run-plan.md`` for each field's meaning."""

    model: ModelShape
    params: ParamSplit
    active_params: int
    placement: Placement
    layout: ParallelLayout
    batch: BatchPlan
    trainer: TrainerMemory
    host: HostMemory | None
    engine: EngineMemory | None
    recompute: str
    warnings: list[str] = field(default_factory=list)
    timeline: list[Phase] | None = None  # colocated: one GPU's memory per hand-over phase
    critic: CriticPlan | None = None  # --advantage-estimator ppo
    features: list[tuple[str, str]] = field(default_factory=list)  # (flag, note): GPU-only / refused / spec
    # (config, summary): megatron-core's config objects the entry point built (the dry run: as on GPU);
    # set by the entry point, which may import the backend (this package may not)
    megatron_configs: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """True when trainer GPUs, engine GPUs and (when a budget is given) host RAM all fit."""
        host_ok = self.host is None or self.host.fits is not False
        engine_ok = self.engine is None or self.engine.fits
        timeline_ok = all(phase.fits for phase in self.timeline or [])
        critic_ok = self.critic is None or self.critic.memory.fits
        return self.trainer.fits and host_ok and engine_ok and timeline_ok and critic_ok


def _recompute_text(args: Namespace) -> str:
    granularity = getattr(args, "recompute_granularity", None)
    if granularity is None:
        return "none"
    if granularity == "selective":
        return "selective (core attention)"
    method = getattr(args, "recompute_method", None) or "uniform"
    return f"full, {method}, {getattr(args, 'recompute_num_layers', None) or 1} layer(s)"


def features_from_args(args: Namespace) -> list[tuple[str, str]]:
    """(flag, note) rows: the user layer spec, GPU-only features (refused at start-up without
    CUDA) and flags refused at start-up whatever the machine."""
    from slime.utils.arguments import startup_refusals
    from slime.utils.arguments.features import gpu_only_flags

    rows = []
    if getattr(args, "spec", None):
        rows.append(("--spec", f"{args.spec[0]}.{args.spec[1]}(args, config, vp_stage) builds the layers"))
    rows += [(flag, f"GPU only: {need}; refused at start-up without CUDA") for flag, need in gpu_only_flags(args)]
    rows += [(refusal.split(":", 1)[0], "REFUSED at start-up:" + refusal.split(":", 1)[1])
             for refusal in startup_refusals(args, cuda_available=True)]
    return rows


def build_plan(args: Namespace) -> Plan:
    """Build the plan from a parsed namespace (``slime.utils.arguments.parse_args``).

    Raises ValueError naming the flag when the arguments cannot be laid out (e.g. world size not
    divisible by TP*PP*CP).
    """
    shape = shape_from_args(args)
    layout = layout_from_args(args)
    placement = placement_from_args(args)
    trainer = trainer_memory(args, shape, layout)
    engine = engine_memory(args, shape, placement.engines[0]) if placement.engines else None
    return Plan(
        model=shape,
        params=total_params(shape),
        active_params=active_params(shape),
        placement=placement,
        layout=layout,
        batch=batch_from_args(args, layout.dp, layout.cp),
        trainer=trainer,
        host=host_memory(args, trainer),
        engine=engine,
        recompute=_recompute_text(args),
        warnings=list(getattr(args, "warnings", None) or []),
        timeline=colocated_timeline(args, trainer, engine),
        critic=critic_plan(args, shape, placement.critic_gpus),
        features=features_from_args(args),
    )
