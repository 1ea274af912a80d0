"""The trainer's on-policy distillation step on a rank's share of the rollout: the advantages of
its samples get the teacher term, the other samples stay None, a missing teacher is named."""

import pytest
import torch

from slime.backends.megatron_utils import opd


def _rollout():
    # rank's samples 0 and 2; sample 1 belongs to another data-parallel rank
    return {
        "advantages": [torch.tensor([1.0, 1.0]), None, torch.tensor([-0.5])],
        "log_probs": [torch.tensor([-1.0, -2.0]), None, torch.tensor([-0.2])],
        "teacher_log_probs": [[-1.5, -0.5], [-9.0], [-0.2]],
        "loss_masks": [[1, 1], [1], [1]],
    }


def test_distillation_term_on_this_ranks_samples_only():
    data = _rollout()
    opd.add_distillation(data, [0, 2], kl_coef=2.0)
    # sample 0: KL [0.5, -1.5] -> [1 - 1, 1 + 3]; sample 2: KL [0] -> unchanged
    torch.testing.assert_close(data["advantages"][0], torch.tensor([0.0, 4.0]))
    torch.testing.assert_close(data["advantages"][2], torch.tensor([-0.5]))
    assert data["advantages"][1] is None


def test_missing_teacher_log_probs_are_named():
    data = _rollout()
    del data["teacher_log_probs"]
    with pytest.raises(KeyError, match="teacher_log_probs"):
        opd.add_distillation(data, [0], kl_coef=1.0)
    data = _rollout()
    data["teacher_log_probs"][2] = None
    with pytest.raises(ValueError, match="sample 2 has no teacher_log_probs"):
        opd.add_distillation(data, [0, 2], kl_coef=1.0)
