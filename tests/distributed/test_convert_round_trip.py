"""HF -> torch_dist on 2 gloo ranks (torchrun) -> HF on 1 rank is bit-identical: EP=2, PP=2, TP=2; and for
the DeepSeek-V3 (MLA, expert bias, shared expert) and GLM-4.5 MoE families."""

import pytest

from tests.unit.backends.megatron_utils.convert_util import (
    TINY_DEEPSEEK_V3_ARGS,
    TINY_DENSE_ARGS,
    TINY_GLM4_MOE_ARGS,
    TINY_MOE_ARGS,
    assert_same_weights,
    round_trip,
)

pytestmark = pytest.mark.distributed


def test_moe_expert_parallel_2(tiny_moe_hf, tmp_path):
    out = round_trip(tiny_moe_hf, tmp_path, TINY_MOE_ARGS, nproc=2,
                     layout=["--expert-model-parallel-size", "2"])
    assert_same_weights(tiny_moe_hf, out)


def test_moe_pipeline_parallel_2(tiny_moe_hf, tmp_path):
    out = round_trip(tiny_moe_hf, tmp_path, TINY_MOE_ARGS, nproc=2,
                     layout=["--pipeline-model-parallel-size", "2"])
    assert_same_weights(tiny_moe_hf, out)


def test_dense_tensor_parallel_2(tiny_dense_hf, tmp_path):
    # TP=2 pads the 128-row vocab to 256 on save; export must drop the padding again.
    out = round_trip(tiny_dense_hf, tmp_path, TINY_DENSE_ARGS, nproc=2,
                     layout=["--tensor-model-parallel-size", "2"])
    assert_same_weights(tiny_dense_hf, out)


@pytest.mark.parametrize("fixture, model_args, layout", [
    # TP=2 splits MLA's up projections (down projections whole on each rank); EP=2 the routed experts
    ("tiny_deepseek_v3_hf", TINY_DEEPSEEK_V3_ARGS, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ("tiny_glm4_moe_hf", TINY_GLM4_MOE_ARGS, ["--expert-model-parallel-size", "2"]),
], ids=["deepseek_v3-tp2", "glm4_moe-ep2"])
def test_model_family_round_trip(request, tmp_path, fixture, model_args, layout):
    hf_dir = request.getfixturevalue(fixture)
    out = round_trip(hf_dir, tmp_path, model_args, nproc=2, layout=layout)
    assert_same_weights(hf_dir, out)
