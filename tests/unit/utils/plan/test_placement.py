"""Placement of trainer ranks and engines, and batch arithmetic, on hand-sized clusters."""

from argparse import Namespace

import pytest

from slime.utils.plan.placement import batch_from_args, placement_from_args


def _cluster(**kw):
    base = dict(actor_num_nodes=1, actor_num_gpus_per_node=4, rollout_num_gpus=4, rollout_num_gpus_per_engine=2,
                num_gpus_per_node=4, colocate=False)
    base.update(kw)
    return Namespace(**base)


def test_disaggregated_actor_first_then_engines():
    p = placement_from_args(_cluster())
    assert p.trainer_gpus == [0, 1, 2, 3] and p.total_gpus == 8 and p.num_nodes == 2
    assert [e.gpus for e in p.engines] == [[4, 5], [6, 7]]
    assert [p.node_of(e.gpus[0]) for e in p.engines] == [1, 1]
    assert p.engines[0].tp == 2 and p.engines[0].dp == 1


def test_colocated_shares_max_gpus_and_engine_sizes():
    p = placement_from_args(_cluster(colocate=True, rollout_num_gpus=None, rollout_num_gpus_per_engine=4,
                                     sglang_enable_dp_attention=True, sglang_dp_size=4, sglang_ep_size=4))
    assert p.total_gpus == 4 and [e.gpus for e in p.engines] == [[0, 1, 2, 3]]
    assert (p.engines[0].tp, p.engines[0].dp, p.engines[0].ep) == (4, 4, 4)
    wide = placement_from_args(_cluster(colocate=True, rollout_num_gpus=8))
    assert wide.total_gpus == 8 and len(wide.engines) == 4


def test_engine_tp_divides_by_pp_and_indivisible_rollout_is_an_error():
    p = placement_from_args(_cluster(rollout_num_gpus_per_engine=4, sglang_pp_size=2))
    assert p.engines[0].tp == 2
    with pytest.raises(ValueError, match="--rollout-num-gpus-per-engine"):
        placement_from_args(_cluster(rollout_num_gpus=6, rollout_num_gpus_per_engine=4))


def _batch(**kw):
    base = dict(rollout_batch_size=8, n_samples_per_prompt=4, global_batch_size=16, num_steps_per_rollout=None,
                micro_batch_size=2, use_dynamic_batch_size=False, max_tokens_per_gpu=None,
                rollout_max_prompt_len=None, rollout_max_response_len=1000, over_sampling_batch_size=None)
    base.update(kw)
    return Namespace(**base)


def test_static_batch_arithmetic():
    b = batch_from_args(_batch(), dp=2, cp=1)
    # 8 prompts x 4 = 32 samples; GBS 16 -> 2 steps; 16 / DP 2 = 8 per rank; / MBS 2 = 4 micro-batches.
    assert (b.samples_per_rollout, b.steps_per_rollout, b.samples_per_dp_rank, b.micro_batches) == (32, 2, 8, 4)
    assert not b.notes or "prompts" in b.notes[0]


def test_dynamic_batch_estimate_uses_max_length_and_cp():
    b = batch_from_args(_batch(use_dynamic_batch_size=True, max_tokens_per_gpu=3000, rollout_max_prompt_len=500),
                        dp=2, cp=2)
    # 8 samples per rank x 1500 tokens = 12,000 tokens; 3000 tokens x CP 2 per micro-batch -> 2.
    assert b.dynamic and b.max_seq_len == 1500 and b.micro_batches == 2 and b.notes == []


def test_steps_from_num_steps_per_rollout_and_uneven_gbs_note():
    b = batch_from_args(_batch(global_batch_size=None, num_steps_per_rollout=4), dp=1, cp=1)
    assert (b.global_batch_size, b.steps_per_rollout) == (8, 4)
    b = batch_from_args(_batch(global_batch_size=12), dp=1, cp=1)
    assert any("not a multiple" in n for n in b.notes)
