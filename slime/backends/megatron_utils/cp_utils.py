"""slime's `cp_utils` import path for plugins: the sample-mean reducer with slime's argument order.

Context parallelism is not implemented here (docs/plugins.md); the reducer covers whole responses.
"""

from __future__ import annotations

from slime.utils.losses import get_sum_of_sample_mean as _reducer


def get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, sample_denoms=None,
                           calculate_per_token_loss: bool = False):
    """Reducer x [sum(response_lengths)] -> scalar: the sum of per-sample masked means (or, with
    `calculate_per_token_loss`, the masked token sum); `sample_denoms` overrides the per-sample
    denominators. slime's argument order (`slime.utils.losses` puts the per-token flag 4th)."""
    return _reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss, sample_denoms=sample_denoms)
