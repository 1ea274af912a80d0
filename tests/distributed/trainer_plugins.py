"""Plugin functions the trainer calls in test_trainer_plugins (slime signatures); each records
what it saw as one JSON line in the file named by $SLIME_PLUGIN_PROBE."""

from __future__ import annotations

import json
import os

import torch


def _record(**entry) -> None:
    with open(os.environ["SLIME_PLUGIN_PROBE"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def postprocess(args, rollout_id, rollout_data):
    """--rollout-data-postprocess-path: must run after log-probs and advantages exist."""
    present = [k for k in ("log_probs", "advantages", "returns") if k in rollout_data]
    _record(hook="postprocess", rollout_id=rollout_id, present=present)


def advantage(args, rollout_data):
    """--custom-advantage-function-path: advantage = reward on every token."""
    n = len(rollout_data["tokens"])
    adv = [None] * n
    for i in range(n):
        if rollout_data["log_probs"][i] is not None:
            adv[i] = torch.full((rollout_data["response_lengths"][i],), float(rollout_data["rewards"][i]))
    rollout_data["advantages"], rollout_data["returns"] = adv, adv
    _record(hook="advantage")


def tis(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
    """--custom-tis-function-path in slime's style (everything by keyword, args included)."""
    _record(hook="tis", has_args=args is not None, response_lengths=list(response_lengths))
    return pg_loss, loss_masks, {"probe": torch.ones_like(pg_loss)}


def loss(args, batch, logits, sum_of_sample_mean):
    """--custom-loss-function-path: mean squared logit (as in slime, batch["log_probs"] are the
    old policy's; the current policy is in `logits`), so a step must lower it."""
    value = logits.float().pow(2).mean()
    _record(hook="loss", keys=sorted(k for k in batch if k in ("log_probs", "loss_masks", "advantages")),
            reducer=float(sum_of_sample_mean(batch["advantages"].float())) if "advantages" in batch else None)
    return value, {"custom": value.detach()}


def before_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """--custom-megatron-before-train-step-hook-path: step_id counts within the rollout (slime)."""
    _record(hook="before_step", rollout_id=rollout_id, step_id=step_id)


def pg_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """--custom-pg-loss-reducer-function-path: slime's default reducer, built at slime's path."""
    from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean

    _record(hook="pg_reducer", samples=len(response_lengths), per_token=calculate_per_token_loss)
    return get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, None, calculate_per_token_loss)


def before_log_prob(args, model, store_prefix):
    """--custom-megatron-before-log-prob-hook-path: once per log-prob pass, with the model chunks."""
    _record(hook="before_log_prob", store_prefix=store_prefix, chunks=len(model))
