"""slime.backends.megatron_utils.cp_utils: which response tokens a zigzag CP rank computes,
slicing a whole response down to them and gathering the shares back."""

from __future__ import annotations

import pytest
import torch

from slime.backends.megatron_utils import cp_utils


def test_slots_follow_the_zigzag_chunks_by_hand():
    # total 11, response 5, cp 2: padded to 12, chunks of 3; rank 0 holds positions 0-2 and 9-11,
    # rank 1 holds 3-5 and 6-8; the response's predictors are positions 5..9
    assert cp_utils.response_slots_with_cp(11, 5, 0, 2).tolist() == [4]
    assert cp_utils.response_slots_with_cp(11, 5, 1, 2).tolist() == [0, 1, 2, 3]
    assert cp_utils.response_slots_with_cp(11, 5, 0, 1).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="response_length"):
        cp_utils.response_slots_with_cp(3, 4, 0, 2)


@pytest.mark.parametrize("total,resp,cp", [(11, 5, 2), (37, 20, 4), (8, 1, 2)])
def test_slice_then_gather_gives_back_the_whole_response(monkeypatch, total, resp, cp):
    whole = torch.arange(resp, dtype=torch.float32) + 1
    gathered, seen = torch.zeros(resp), []
    for rank in range(cp):
        monkeypatch.setattr(cp_utils, "_cp_layout", lambda rank=rank: (rank, cp, None))
        local = cp_utils.slice_log_prob_with_cp(whole, total, resp)
        assert cp_utils.slice_log_prob_with_cp(whole.tolist(), total, resp) == local.tolist()
        seen += local.tolist()
        gathered += cp_utils.all_gather_with_cp(local, total, resp)  # no group: this rank's part of the sum
    assert sorted(seen) == whole.tolist() and torch.equal(gathered, whole)


def test_without_cp_both_pass_through_and_sizes_are_checked(monkeypatch):
    x = torch.tensor([1.0, 2.0])
    assert cp_utils.slice_log_prob_with_cp(x, 5, 2) is x and cp_utils.all_gather_with_cp(x, 5, 2) is x
    with pytest.raises(ValueError, match="response_length is 3"):
        cp_utils.slice_log_prob_with_cp(x, 5, 3)
    monkeypatch.setattr(cp_utils, "_cp_layout", lambda: (1, 2, None))
    with pytest.raises(ValueError, match="holds 4"):
        cp_utils.all_gather_with_cp(x, 11, 5)
