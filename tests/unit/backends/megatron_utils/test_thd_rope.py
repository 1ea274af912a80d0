"""The one-pass unfused THD RoPE (te_absent.patch_unfused_thd_rope) is bitwise megatron's loop.

Upstream's ``_apply_rotary_pos_emb_thd`` slices the frequencies sequence by sequence; ours gathers
them by in-sequence position. Same values on the same tokens, the same elementwise rotation: the
outputs and the gradients must be equal, not close. The wrapper is built around upstream's
function here, never installed into megatron's module (the test process stays unpatched).
"""

import pytest
import torch

from slime.backends.megatron_utils.te_absent import _thd_rope_in_one_pass

rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")


class _Group:
    """What the RoPE functions ask of a context-parallel group."""

    def __init__(self, size=1, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _case(lengths, *, heads=4, head_dim=16, rot_dim=16, max_len=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    t = torch.randn(sum(lengths), heads, head_dim, generator=gen, requires_grad=True)
    max_len = max_len or max(lengths)
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    freqs = torch.cat([freqs, freqs], dim=-1)[:, None, None, :]
    return t, cu, freqs


def _both(t, cu, freqs, **kwargs):
    upstream = rope_utils._apply_rotary_pos_emb_thd
    ours = _thd_rope_in_one_pass(upstream)
    results = []
    for fn in (upstream, ours):
        x = t.detach().clone().requires_grad_(True)
        out = fn(x, cu, freqs, **kwargs)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).sin())
        results.append((out.detach(), x.grad))
    return results


@pytest.mark.parametrize("lengths", [[1] * 256, [7, 1, 30, 2, 5], [64], [3, 0, 4, 0, 9]])
@pytest.mark.parametrize("interleaved", [False, True])
def test_outputs_and_gradients_are_bitwise_upstreams(lengths, interleaved):
    t, cu, freqs = _case(lengths, max_len=max(lengths) + 3)
    (out_a, grad_a), (out_b, grad_b) = _both(t, cu, freqs, rotary_interleaved=interleaved, cp_group=_Group())
    assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b)


def test_partial_rotary_and_mscale_are_bitwise_upstreams():
    t, cu, freqs = _case([5, 9, 2], head_dim=16, rot_dim=8)
    (out_a, grad_a), (out_b, grad_b) = _both(t, cu, freqs, mscale=0.7, cp_group=_Group())
    assert torch.equal(out_a, out_b) and torch.equal(grad_a, grad_b)
    assert torch.equal(out_a[..., 8:], t[..., 8:].detach()), "the unrotated part passes through"


def test_left_to_upstream_context_parallel_and_offset_mapped_freqs(monkeypatch):
    seen = []

    def upstream(*args, **kwargs):
        seen.append(kwargs["cp_group"])
        return "upstream"

    ours = _thd_rope_in_one_pass(upstream)
    t, cu, freqs = _case([4, 4])
    cp2 = _Group(size=2, rank=1)
    assert ours(t, cu, freqs, cp_group=cp2) == "upstream"
    _, _, all_positions = _case([8])  # one frequency row per packed position: upstream's offset mapping
    assert ours(t, cu, all_positions, cp_group=_Group()) == "upstream"
    assert ours(t, cu, freqs, cp_group=None) == "upstream"  # upstream raises its own error for it
    assert seen == [cp2, seen[1], None]


def test_sequence_longer_than_the_frequencies_fails_as_upstream_does():
    t, cu, freqs = _case([3, 9], max_len=4)
    with pytest.raises((RuntimeError, IndexError)):
        rope_utils._apply_rotary_pos_emb_thd(t, cu, freqs, cp_group=_Group())
    with pytest.raises((RuntimeError, IndexError)):
        _thd_rope_in_one_pass(rope_utils._apply_rotary_pos_emb_thd)(t, cu, freqs, cp_group=_Group())
