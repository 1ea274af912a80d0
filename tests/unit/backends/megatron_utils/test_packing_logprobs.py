"""Packing (mask, positions, response slices) and vocab-parallel log-probs on one rank."""

import torch

from slime.backends.megatron_utils.logprobs import vocab_parallel_log_probs
from slime.backends.megatron_utils.packing import gather_response, pack_sequences, response_slices, response_targets


def test_pack_two_samples_mask_and_positions():
    batch = pack_sequences([[5, 6, 7], [8, 9]], response_lengths=[1, 1], pad_to_multiple=3)
    assert batch.tokens.tolist() == [[5, 6, 7, 8, 9, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch.cu_seqlens.tolist() == [0, 3, 5]
    allowed = ~batch.attention_mask[0, 0]
    # sample 2's first token sees only itself, never sample 1
    assert allowed[3].tolist() == [False, False, False, True, False, False]
    assert allowed[2].tolist() == [True, True, True, False, False, False]
    assert allowed[5].tolist() == [False] * 5 + [True]


def test_response_slices_predict_response_tokens():
    batch = pack_sequences([[1, 2, 3, 4], [5, 6, 7]], response_lengths=[2, 1])
    assert response_slices(batch) == [slice(1, 3), slice(5, 6)]
    assert [t.tolist() for t in response_targets(batch)] == [[3, 4], [7]]
    per_pos = torch.arange(7.0)
    assert gather_response(per_pos, batch).tolist() == [1.0, 2.0, 5.0]


def test_log_probs_and_entropy_match_softmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 11, requires_grad=True)
    targets = torch.tensor([0, 3, 10, 7, 7])
    lp, ent = vocab_parallel_log_probs(logits, targets, temperature=0.7, with_entropy=True)
    ref = torch.log_softmax(logits.detach() / 0.7, dim=-1)
    assert torch.allclose(lp, ref.gather(-1, targets[:, None]).squeeze(-1), atol=1e-6)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-6)
    lp.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_bad_response_length_is_named():
    import pytest

    with pytest.raises(ValueError, match="response length 3"):
        pack_sequences([[1, 2, 3]], response_lengths=[3])
