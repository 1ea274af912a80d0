"""Packing (THD segments, positions, response picks, context-parallel zigzag) and vocab-parallel
log-probs on one rank."""

import pytest
import torch

from slime.backends.megatron_utils.logprobs import gather_context_parallel, vocab_parallel_log_probs
from slime.backends.megatron_utils.packing import (
    cp_padded_length,
    local_row_length,
    pack_sequences,
    packed_seq_params,
    zigzag_positions,
)


def test_pack_two_samples_segments_and_positions():
    batch = pack_sequences([[5, 6, 7], [8, 9]], response_lengths=[1, 1], pad_to_multiple=3)
    assert batch.tokens.tolist() == [[5, 6, 7, 8, 9, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    # the end padding is a segment of its own: no sample attends to it, cu_seqlens covers the row
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 6]
    assert batch.cu_seqlens.dtype == torch.int32 and batch.max_seqlen == 3
    params = packed_seq_params(batch)
    assert params.qkv_format == "thd" and params.max_seqlen_q == params.max_seqlen_kv == 3
    assert params.cu_seqlens_q is batch.cu_seqlens and params.cu_seqlens_kv is batch.cu_seqlens


def test_no_padding_segment_when_the_row_is_full():
    batch = pack_sequences([[1, 2, 3, 4], [5, 6, 7]], response_lengths=[2, 1], min_length=7)
    assert batch.cu_seqlens.tolist() == [0, 4, 7]
    assert pack_sequences([[1, 2, 3]], [1], min_length=5).cu_seqlens.tolist() == [0, 3, 5]


def test_response_picks_predict_response_tokens():
    batch = pack_sequences([[1, 2, 3, 4], [5, 6, 7]], response_lengths=[2, 1])
    # position t predicts token t + 1: responses [3, 4] and [7] are predicted at 1, 2 and 5
    assert batch.logit_index.tolist() == [1, 2, 5]
    assert batch.target_ids.tolist() == [3, 4, 7]
    assert batch.flat_index.tolist() == [0, 1, 2]


def test_zigzag_chunks():
    assert cp_padded_length(7, 1) == 7 and cp_padded_length(7, 2) == 8 and cp_padded_length(9, 2) == 12
    # 8 tokens, cp 2: chunks of 2; rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2
    assert zigzag_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="multiple of 2"):
        zigzag_positions(6, 0, 2)
    assert local_row_length([7, 9], cp_size=2) == 4 + 6 and local_row_length([7, 9]) == 16


def _cp_samples():
    g = torch.Generator().manual_seed(0)
    lengths, responses = (7, 9, 5, 12), (3, 4, 2, 6)
    return [torch.randint(1, 50, (n,), generator=g).tolist() for n in lengths], list(responses)


@pytest.mark.parametrize("cp", [2, 3])
def test_context_parallel_split_covers_the_unsplit_batch(cp):
    seqs, resp = _cp_samples()
    whole = pack_sequences(seqs, resp)
    ranks = [pack_sequences(seqs, resp, pad_to_multiple=2, cp_rank=r, cp_size=cp) for r in range(cp)]
    padded = [cp_padded_length(len(s), cp) for s in seqs]
    for batch in ranks:
        # cu_seqlens: whole padded samples (+ the end padding), as TE's THD CP attention expects
        assert batch.cu_seqlens.tolist()[:5] == [0, *torch.tensor(padded).cumsum(0).tolist()]
        assert int(batch.cu_seqlens[-1]) == batch.num_tokens * cp
        assert batch.num_tokens % 2 == 0 and batch.max_seqlen == max(padded)
    # every response token is predicted on exactly one rank, with the unsplit target
    flat = torch.cat([b.flat_index for b in ranks])
    assert sorted(flat.tolist()) == list(range(sum(resp)))
    targets = torch.zeros(sum(resp), dtype=torch.long)
    for b in ranks:
        targets[b.flat_index] = b.target_ids
        # the predicting row position holds the same token at the same sample position as unsplit
        for field in ("tokens", "position_ids"):
            got, want = getattr(b, field)[0, b.logit_index], getattr(whole, field)[0, whole.logit_index]
            assert got.tolist() == want[b.flat_index].tolist()
    assert targets.tolist() == whole.target_ids.tolist()
    for r, b in enumerate(ranks):  # each rank's row is its zigzag chunks, sample after sample
        want = torch.cat([torch.tensor(s + [0] * (p - len(s)))[zigzag_positions(p, r, cp)]
                          for s, p in zip(seqs, padded)])
        assert b.tokens[0, :len(want)].tolist() == want.tolist()


def test_context_parallel_gather_on_one_rank_is_a_scatter():
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    full = gather_context_parallel(values, torch.tensor([2, 0, 4]), 5)
    assert full.tolist() == [2.0, 0.0, 1.0, 0.0, 3.0]
    (full * torch.arange(5.0)).sum().backward()
    assert values.grad.tolist() == [2.0, 0.0, 4.0]


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
    with pytest.raises(ValueError, match="response length 3"):
        pack_sequences([[1, 2, 3]], response_lengths=[3])


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunked_log_probs_equal_the_whole(chunk):
    """--log-probs-chunk-size: the same values and gradients, a chunk of tokens at a time (padded
    vocabulary columns excluded as in the whole computation)."""
    from slime.backends.megatron_utils.logprobs import chunked_log_probs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 12, generator=g, requires_grad=True)
    targets = torch.randint(0, 10, (7,), generator=g)
    kw = dict(temperature=0.7, with_entropy=True, vocab_size=10)
    whole_lp, whole_ent = vocab_parallel_log_probs(logits, targets, **kw)
    (whole_grad,) = torch.autograd.grad((whole_lp + whole_ent).sum(), logits)
    lp, ent = chunked_log_probs(logits, targets, chunk, **kw)
    (grad,) = torch.autograd.grad((lp + ent).sum(), logits)
    torch.testing.assert_close((lp, ent, grad), (whole_lp, whole_ent, whole_grad))
    lp, ent = chunked_log_probs(logits, targets, chunk, temperature=1.0)
    assert ent is None and lp.shape == (7,)


def test_non_finite_training_loss_stops_unless_disabled():
    """Megatron-LM's check_for_nan_in_loss_and_grad (on by default): a NaN loss raises naming the
    samples and the flag; --no-check-for-nan-in-loss-and-grad lets it through."""
    from slime.backends.megatron_utils.train_step import MicroBatch, train_loss_fn

    mb = MicroBatch(packed=pack_sequences([[1, 2, 3, 4], [5, 6, 7]], response_lengths=[2, 1], sample_ids=[4, 9]))
    logits = torch.randn(1, 7, 10)

    def nan_loss(mb, log_probs, entropy, logits):
        return log_probs.sum() * float("nan"), {}

    kw = dict(compute_loss=nan_loss, scale=1.0, tp_group=None, temperature=1.0, with_entropy=False)
    with pytest.raises(RuntimeError, match=r"training loss is nan for samples \[4, 9\].*--no-check-for-nan"):
        train_loss_fn(mb, logits, check_finite=True, **kw)
    loss, _ = train_loss_fn(mb, logits, check_finite=False, **kw)
    assert loss.isnan()


def test_whole_sample_packing_equals_the_general_path():
    """Without CP, `pack_sequences` takes a list-based fast path: field for field the same batch
    as the general (zigzag) path at cp_size 1, with and without end padding."""
    from slime.backends.megatron_utils import packing

    seqs = [[5, 6, 7, 8, 9], [1, 2, 3], [4, 4, 4, 4, 4, 4, 4]]
    resp = [2, 1, 5]
    for pad, min_length in ((1, 0), (4, 0), (1, 20)):
        fast = packing.pack_sequences(seqs, resp, sample_ids=[7, 3, 9], pad_to_multiple=pad, min_length=min_length)
        slow = packing._pack_split(seqs, resp, [7, 3, 9], pad, "cpu", min_length, 0, 1)
        for name in ("tokens", "position_ids", "cu_seqlens", "logit_index", "target_ids", "flat_index"):
            a, b = getattr(fast, name), getattr(slow, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        for name in ("max_seqlen", "total_lengths", "response_lengths", "sample_ids", "cp_size"):
            assert getattr(fast, name) == getattr(slow, name), name


def test_entropy_only_reported_has_no_graph_and_the_same_values():
    """--entropy-coef 0: the entropy is computed without autograd (none of its [N, V] temporaries
    is kept for the backward); values and the log-probs' gradients do not change."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 9, generator=g, requires_grad=True)
    targets = torch.randint(0, 8, (6,), generator=g)
    kw = dict(temperature=0.7, with_entropy=True, vocab_size=8)
    lp, ent = vocab_parallel_log_probs(logits, targets, **kw)
    (grad,) = torch.autograd.grad(lp.sum(), logits)
    lp_nograd, ent_nograd = vocab_parallel_log_probs(logits, targets, entropy_grad=False, **kw)
    assert ent.grad_fn is not None and ent_nograd.grad_fn is None and not ent_nograd.requires_grad
    (grad_nograd,) = torch.autograd.grad(lp_nograd.sum(), logits)
    torch.testing.assert_close((lp_nograd, ent_nograd, grad_nograd), (lp, ent.detach(), grad), rtol=0, atol=0)


@pytest.mark.parametrize("entropy_coef,custom_loss,expect", [(0.0, None, False), (0.01, None, True), (0.0, print, True)])
def test_trainer_keeps_the_entropy_graph_only_when_a_loss_trains_on_it(monkeypatch, entropy_coef, custom_loss, expect):
    from types import SimpleNamespace

    from slime.backends.megatron_utils import actor

    groups = SimpleNamespace(get_tensor_model_parallel_group=lambda: None, get_context_parallel_group=lambda: None)
    monkeypatch.setattr(actor, "_mpu", lambda: groups)
    trainer = SimpleNamespace(_custom_loss=custom_loss, args=SimpleNamespace(
        entropy_coef=entropy_coef, rollout_temperature=1.0, vocab_size=None, log_probs_chunk_size=-1))
    assert actor.MegatronTrainer._logprob_kw(trainer, with_entropy=True)["entropy_grad"] is expect
