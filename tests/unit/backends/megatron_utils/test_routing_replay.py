"""Routing replay rows line up with the packed tokens (CP zigzag, end padding, SP shares), and a
recorded row unpacks back to each sample's positions."""

import numpy as np
import pytest
import torch

from slime.backends.megatron_utils.packing import pack_sequences
from slime.backends.megatron_utils.routing_replay import routing_row, sequence_parallel_share, unpack_row

LAYERS, TOPK = 2, 2


def _routing(tokens: list[int]) -> np.ndarray:
    """A routing that encodes the token id it belongs to: [len - 1, layers, topk] (SGLang's rows)."""
    t = np.asarray(tokens[:-1], dtype=np.int32)
    return np.stack([np.stack([t, t + 1], -1), np.stack([t + 2, t + 3], -1)], 1)


@pytest.mark.parametrize("cp_size", [1, 2])
def test_rows_follow_the_packed_tokens(cp_size):
    seqs = [[10, 11, 12, 13, 14], [20, 21, 22]]
    for cp_rank in range(cp_size):
        packed = pack_sequences(seqs, [2, 1], pad_to_multiple=2, cp_rank=cp_rank, cp_size=cp_size)
        row = routing_row([_routing(s) for s in seqs], packed.total_lengths, packed.num_tokens,
                          num_layers=LAYERS, topk=TOPK, cp_rank=cp_rank, cp_size=cp_size)
        assert row.shape == (packed.num_tokens, LAYERS, TOPK)
        tokens = packed.tokens[0]
        fed = torch.isin(tokens, torch.tensor([t for s in seqs for t in s[:-1]]))
        assert fed.any()
        assert torch.equal(row[fed, 0, 0], tokens[fed].to(torch.int32))  # each fed token's own routing
        assert torch.equal(row[fed, 1, 1], tokens[fed].to(torch.int32) + 3)
        assert torch.equal(row[~fed, 0], torch.arange(TOPK, dtype=torch.int32).expand(int((~fed).sum()), TOPK))


def test_sequence_parallel_shares_are_contiguous_and_unpack_inverts():
    seqs = [[1, 2, 3, 4], [5, 6, 7]]
    packed = pack_sequences(seqs, [1, 1], pad_to_multiple=2)
    row = routing_row([_routing(s) for s in seqs], packed.total_lengths, packed.num_tokens, num_layers=LAYERS, topk=TOPK)
    shares = [sequence_parallel_share(row, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(shares), row) and shares[0].shape[0] == row.shape[0] // 2
    full = {}
    unpack_row(row, packed.total_lengths, full, [7, 9])
    assert np.array_equal(full[7][:3].numpy(), _routing(seqs[0])) and np.array_equal(full[9][:2].numpy(), _routing(seqs[1]))


def test_too_few_rows_are_refused():
    with pytest.raises(ValueError, match="fed tokens"):
        routing_row([np.zeros((1, LAYERS, TOPK))], [4], 4, num_layers=LAYERS, topk=TOPK)
