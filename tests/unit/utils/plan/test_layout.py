"""Rank groups match megatron-core's RankGenerator (order tp-cp-ep-dp-pp) and layout arithmetic."""

import itertools
from argparse import Namespace

import pytest
from megatron.core.parallel_state import RankGenerator

from slime.utils.plan.layout import layout_from_args, rank_groups, stage_layer_ranges


@pytest.mark.parametrize("tp, cp, dp, pp", list(itertools.product([1, 2, 4], [1, 2], [1, 3], [1, 2])))
def test_dense_groups_match_megatron(tp, cp, dp, pp):
    ours = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    theirs = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    for kind in ("tp", "cp", "dp", "dp-cp", "pp", "tp-pp"):
        assert rank_groups(ours, kind) == theirs.get_ranks(kind), kind


@pytest.mark.parametrize("etp, ep, edp, pp", list(itertools.product([1, 2], [1, 4], [1, 2], [1, 2])))
def test_expert_groups_match_megatron(etp, ep, edp, pp):
    ours = {"tp": etp, "cp": 1, "ep": ep, "dp": edp, "pp": pp}
    theirs = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    for kind in ("tp", "ep", "dp", "tp-ep"):
        assert rank_groups(ours, kind) == theirs.get_ranks(kind), kind


def _args(**kw):
    base = dict(actor_num_nodes=1, actor_num_gpus_per_node=8, tensor_model_parallel_size=2,
                pipeline_model_parallel_size=2, context_parallel_size=1, expert_model_parallel_size=2,
                expert_tensor_parallel_size=None, sequence_parallel=True)
    base.update(kw)
    return Namespace(**base)


def test_layout_by_hand_tp2_pp2_on_8():
    lay = layout_from_args(_args())
    # DP = 8 / (2*2) = 2; ETP resolves to TP = 2; expert-DP = 8 / (PP2 * EP2 * ETP2) = 1.
    assert (lay.dp, lay.etp, lay.expert_dp) == (2, 2, 1)
    assert lay.groups["TP"][:2] == [[0, 1], [2, 3]]
    assert lay.groups["DP"][:2] == [[0, 2], [1, 3]]
    assert lay.groups["PP"][:2] == [[0, 4], [1, 5]]
    assert lay.groups["EP"][:2] == [[0, 2], [1, 3]]
    assert lay.num_groups["TP"] == 4 and len(lay.groups["TP"]) == 4


def test_layout_rejects_indivisible_world():
    with pytest.raises(ValueError, match="TP\\*PP\\*CP"):
        layout_from_args(_args(actor_num_gpus_per_node=6, pipeline_model_parallel_size=4))


def test_stage_layer_ranges():
    assert stage_layer_ranges(8, 2) == [range(0, 4), range(4, 8)]
    assert [len(r) for r in stage_layer_ranges(7, 3)] == [3, 2, 2]
