"""Per-sample tensors gathered over the trainer ranks: what the actor shares with the critic.

Owns `gather_samples` (per-sample tensors some ranks hold -> all of them on every rank; the critic's
values use it too) and the actor's KL inputs of the critic's returns (`--advantage-estimator ppo`
with `--kl-coef` != 0): `local_kl_inputs` on each actor rank, `gather_kl_inputs` across them. The
actor and the critic both import this module; neither imports the other for it.
"""

from __future__ import annotations

import torch

from slime.backends.megatron_utils import collectives

KL_KEYS = ("log_probs", "ref_log_probs")  # what the actor shares for the reward's KL penalty


def gather_samples(local: dict[int, torch.Tensor], n: int) -> list[torch.Tensor | None]:
    """Per-sample tensors held by some ranks (sample index -> tensor) -> the list of all `n`,
    on every rank (all_gather_object over the whole trainer group). Missing samples are None."""
    parts = collectives.all_gather_object({i: t.detach().cpu() for i, t in local.items()})
    merged: dict[int, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return [merged.get(i) for i in range(n)]


def local_kl_inputs(rollout_data: dict, indices: list[int]) -> dict[str, dict[int, torch.Tensor]]:
    """The actor's share of KL_KEYS for the samples `indices` (empty where it has none)."""
    out = {}
    for key in KL_KEYS:
        column = rollout_data.get(key)
        if column is not None:
            out[key] = {i: torch.as_tensor(column[i]) for i in indices if column[i] is not None}
    return out


def gather_kl_inputs(local: dict[str, dict[int, torch.Tensor]], n: int) -> dict[str, list]:
    """`local_kl_inputs` of every actor rank -> {key: all n per-sample tensors}; keys with a
    missing sample are left out (the critic then has no KL penalty for them)."""
    out = {}
    for key in KL_KEYS:  # every rank takes part in every gather, whatever it holds
        gathered = gather_samples(local.get(key, {}), n)
        if all(t is not None for t in gathered):
            out[key] = gathered
    return out
