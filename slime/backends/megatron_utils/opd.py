"""On-policy distillation in the trainer (`--use-opd`): the teacher's weights for `--opd-type
megatron`, the distillation term added to the actor's advantages, and its metric.

The megatron teacher is held like the reference model (`reference.HostReference`): a bare model
of the student's architecture receives `--opd-teacher-load`'s weights at start-up, its tensors are
copied to the host and the model is freed; the teacher pass swaps them into the actor chunk and
restores the actor's weights bit for bit. With `--opd-type sglang` the teacher's log-probs arrive
with the rollout (`Sample.teacher_log_probs`, from `slime.rollout.opd_teacher`).
"""

from __future__ import annotations

import torch

from slime.backends.megatron_utils import collectives
from slime.utils.advantages import apply_opd_advantages, masked_mean_kl, opd_reverse_kl

TEACHER_KEY = "teacher_log_probs"


def load_host_teacher(args, build_model):
    """`--opd-type megatron`: the teacher's weights on the host (`HostReference`), read from
    `--opd-teacher-load` into `build_model()` (a frozen stage of the student's flags), which is
    dropped afterwards. The checkpoint's tensors must be the student's (same names and shapes)."""
    from slime.backends.megatron_utils.checkpoint import load_model_weights
    from slime.backends.megatron_utils.reference import HostReference

    model = build_model()
    load_model_weights(args.opd_teacher_load, model, flag="--opd-teacher-load")
    teacher = HostReference.from_module(model)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return teacher


def _teacher_tensors(rollout_data: dict, mine: list[int]) -> list[torch.Tensor]:
    if TEACHER_KEY not in rollout_data:
        raise KeyError("--use-opd: the rollout carries no teacher_log_probs (with --opd-type sglang every sample "
                       "needs Sample.teacher_log_probs; a custom rollout function must fetch them)")
    out = []
    for i in mine:
        value = rollout_data[TEACHER_KEY][i]
        if value is None:
            raise ValueError(f"--use-opd: sample {i} has no teacher_log_probs")
        out.append(torch.as_tensor(value, dtype=torch.float32))
    return out


def add_distillation(rollout_data: dict, mine: list[int], kl_coef: float) -> None:
    """`rollout_data["advantages"][i]` -= kl_coef * (log_probs[i] - teacher_log_probs[i]) for the
    samples `mine` (last pipeline stage, after the estimator, before whitening), in place."""
    if not mine:
        return
    advantages = [rollout_data["advantages"][i] for i in mine]
    student = [torch.as_tensor(rollout_data["log_probs"][i], dtype=torch.float32) for i in mine]
    for i, adv in zip(mine, apply_opd_advantages(advantages, student, _teacher_tensors(rollout_data, mine), kl_coef)):
        rollout_data["advantages"][i] = adv


def reverse_kl_metric(rollout_data: dict, mine: list[int], is_last_stage: bool, dp_group, pp_group,
                      last_rank: int) -> dict[str, float]:
    """`train/opd_reverse_kl`: the token mean over trainable tokens of (student - teacher log-prob)
    of every sample, summed over data parallel on the last stage and broadcast over the pipeline
    (collective over all ranks; the same value everywhere)."""
    moments = torch.zeros(2, dtype=torch.float64)
    if is_last_stage:
        if mine:
            student = [torch.as_tensor(rollout_data["log_probs"][i], dtype=torch.float32) for i in mine]
            kls = opd_reverse_kl(student, _teacher_tensors(rollout_data, mine))
            masks = [torch.as_tensor(rollout_data["loss_masks"][i], dtype=torch.float32) for i in mine]
            moments = masked_mean_kl(kls, masks)
        moments = collectives.all_reduce(collectives.to_device(moments), group=dp_group)
    moments = collectives.broadcast(collectives.to_device(moments), last_rank, pp_group).cpu()
    total, count = moments.tolist()
    return {"train/opd_reverse_kl": total / count if count > 0 else 0.0}
