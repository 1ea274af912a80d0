"""HF -> torch_dist on 2 gloo ranks (torchrun) -> HF on 1 rank is bit-identical: EP=2, PP=2, TP=2."""

import pytest

from tests.unit.backends.megatron_utils.convert_util import (
    TINY_DENSE_ARGS,
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
