"""Plugins of the flags e2e run (tests/e2e/test_flags.py), with slime's signatures. Each records
what it saw as JSON lines in `<--save>/../probe_rank<R>.jsonl`, for the test to assert on."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

# --custom-megatron-init-path hands args over to the model provider (slime's providers read
# Megatron's global args; ours has no such global)
_INIT_ARGS = []


def _record(args, **entry) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    with open(Path(args.save).parent / f"probe_rank{rank}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def megatron_init(args) -> None:
    """--custom-megatron-init-path: runs once per rank after Megatron's initialisation."""
    _INIT_ARGS.append(args)
    _record(args, hook="init", parallel_ready=dist.is_initialized())


def model_provider(pre_process, post_process, vp_stage=None):
    """--custom-model-provider-path: the built-in builder, called through the plugin."""
    from slime.backends.megatron_utils.model_provider import build_gpt_model

    args = _INIT_ARGS[-1]
    _record(args, hook="model_provider", pre_process=pre_process, post_process=post_process)
    return build_gpt_model(args, pre_process, post_process, vp_stage=vp_stage)


def advantage(args, rollout_data) -> None:
    """--custom-advantage-function-path: reward + sample index / n on every token of this rank's
    samples (those with reference log-probs), so that data-parallel ranks hold different means."""
    n = len(rollout_data["tokens"])
    adv = [None] * n
    for i in range(n):
        if rollout_data["ref_log_probs"][i] is not None:
            adv[i] = torch.full((rollout_data["response_lengths"][i],), float(rollout_data["rewards"][i]) + i / n)
    rollout_data["advantages"], rollout_data["returns"] = adv, list(adv)


def postprocess(args, rollout_id, rollout_data) -> None:
    """--rollout-data-postprocess-path: this rank's (sum, sum of squares, count) of the advantages
    over loss-masked tokens, after --normalize-advantages."""
    total = total_sq = count = 0.0
    for i, adv in enumerate(rollout_data["advantages"]):
        if adv is None:
            continue
        mask = torch.as_tensor(rollout_data["loss_masks"][i], dtype=torch.float64)
        adv = torch.as_tensor(adv, dtype=torch.float64)
        total, total_sq, count = total + float((adv * mask).sum()), total_sq + float((adv ** 2 * mask).sum()), count + float(mask.sum())
    _record(args, hook="postprocess", rollout_id=rollout_id, sum=total, sum_sq=total_sq, count=count)


def tis(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """--custom-tis-function-path (with --use-tis): keeps the loss, reports train/e2e_tis = 1."""
    return pg_loss, loss_masks, {"e2e_tis": torch.ones_like(pg_loss)}
