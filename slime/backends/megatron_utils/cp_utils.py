"""slime's `cp_utils` import path for plugins: context-parallel slicing of one sample's response
tensors and the sample-mean reducer with slime's argument order.

Under context parallelism (zigzag, `packing.zigzag_positions`) a CP rank computes the log-probs
of the response tokens predicted at the positions it holds: chunk `cp_rank` and chunk
`2*cp-1-cp_rank` of the sample padded to a multiple of 2*cp. `slice_log_prob_with_cp` cuts a
whole response tensor down to those tokens (in that order), `all_gather_with_cp` reassembles the
whole tensor from every rank's share. The trainer itself gathers before the loss (train_step.py),
so plugins see whole responses there; these are for plugins that slice or gather themselves.
"""

from __future__ import annotations

import torch

from slime.backends.megatron_utils.logprobs import gather_context_parallel
from slime.backends.megatron_utils.packing import cp_padded_length, zigzag_positions
from slime.utils.losses import get_sum_of_sample_mean as _reducer


def _cp_layout() -> tuple[int, int, object]:
    """(cp_rank, cp_size, cp_group) of this rank; (0, 1, None) outside an initialised megatron."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    if not dist.is_initialized() or not mpu.model_parallel_is_initialized():
        return 0, 1, None
    return mpu.get_context_parallel_rank(), mpu.get_context_parallel_world_size(), mpu.get_context_parallel_group()


def response_slots_with_cp(total_length: int, response_length: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Indices (0..response_length-1) of the response tokens CP rank `cp_rank` computes, in its
    order: position t predicts token t + 1, so the response's predictors are positions
    total-resp-1 .. total-2."""
    if not 0 < response_length <= total_length:
        raise ValueError(f"response_length {response_length} must be in 1..total_length ({total_length})")
    pos = zigzag_positions(cp_padded_length(total_length, cp_size), cp_rank, cp_size)
    first = total_length - response_length - 1
    return pos[(pos >= first) & (pos < total_length - 1)] - first


def slice_log_prob_with_cp(log_prob, total_length: int, response_length: int):
    """The part of a whole response's per-token `log_prob` (a list or a tensor of
    `response_length` entries) this CP rank computes; unchanged without CP."""
    if len(log_prob) != response_length:
        raise ValueError(f"log_prob has {len(log_prob)} entries, response_length is {response_length}")
    cp_rank, cp_size, _ = _cp_layout()
    if cp_size == 1:
        return log_prob
    slots = response_slots_with_cp(total_length, response_length, cp_rank, cp_size)
    if isinstance(log_prob, torch.Tensor):
        return log_prob.index_select(0, slots.to(log_prob.device))
    return [log_prob[i] for i in slots.tolist()]


def all_gather_with_cp(tensor: torch.Tensor, total_length: int, response_length: int) -> torch.Tensor:
    """This CP rank's share of a response tensor ([local tokens, ...], as `slice_log_prob_with_cp`
    cuts it) -> the whole [response_length, ...] tensor on every CP rank (an all-reduced sum; the
    backward keeps each rank's gradient for its own tokens, as the trainer's gather does)."""
    cp_rank, cp_size, group = _cp_layout()
    if cp_size == 1:
        return tensor
    slots = response_slots_with_cp(total_length, response_length, cp_rank, cp_size).to(tensor.device)
    if tensor.shape[0] != slots.numel():
        raise ValueError(f"CP rank {cp_rank} holds {slots.numel()} of the response's tokens, got {tensor.shape[0]}")
    return gather_context_parallel(tensor, slots, response_length, group)


def get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, sample_denoms=None,
                           calculate_per_token_loss: bool = False):
    """Reducer x [sum(response_lengths)] -> scalar: the sum of per-sample masked means (or, with
    `calculate_per_token_loss`, the masked token sum); `sample_denoms` overrides the per-sample
    denominators. slime's argument order (`slime.utils.losses` puts the per-token flag 4th). The
    reducer takes whole responses: the trainer gathers CP shares before the loss."""
    return _reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss, sample_denoms=sample_denoms)
