"""Issue 11 part 7: one definition each of the secret filter, the --moe-layer-freq syntax and the
eval-dataset list, used by every caller."""

import argparse

import pytest

from slime.backends.megatron_utils.config import parse_moe_layer_freq as megatron_moe_freq
from slime.backends.megatron_utils.torch_dist import plain_args
from slime.rollout import sglang_rollout
from slime.utils.arguments import is_secret_dest, redacted_vars
from slime.utils.arguments.eval import eval_datasets


def test_one_secret_filter_for_dumps_and_checkpoints():
    args = argparse.Namespace(wandb_key="w", sglang_api_key="s", reward_key="score", input_key="prompt", lr=1.0)
    assert is_secret_dest("wandb_key") and is_secret_dest("sglang_api_key")
    assert not is_secret_dest("reward_key") and not is_secret_dest("input_key")
    shown = redacted_vars(args)
    assert shown["wandb_key"] == shown["sglang_api_key"] == "<redacted>" and shown["reward_key"] == "score"
    saved = vars(plain_args(args))
    assert "wandb_key" not in saved and "sglang_api_key" not in saved
    assert saved["reward_key"] == "score" and saved["input_key"] == "prompt"


def test_megatron_side_uses_the_flag_parser():
    assert megatron_moe_freq("([0]*1 + [1]*3)", 4) == [0, 1, 1, 1]
    with pytest.raises(argparse.ArgumentTypeError, match="--moe-layer-freq"):
        megatron_moe_freq("__import__('os')", 4)
    with pytest.raises(argparse.ArgumentTypeError):
        megatron_moe_freq("[2]*4", 4)  # the flag's rule: list entries are 0 or 1


def test_rollout_uses_the_one_eval_dataset_list():
    assert sglang_rollout.eval_datasets is eval_datasets
    assert eval_datasets(argparse.Namespace(eval_prompt_data=[["a", "x.jsonl"]])) == [("a", "x.jsonl")]
    assert eval_datasets(argparse.Namespace(eval_prompt_data=["a", "x", "b", "y"])) == [("a", "x"), ("b", "y")]


def test_hf_config_readers_are_shared_and_the_flag_mapping_round_trips():
    from slime.backends.megatron_utils.hf_loader import model_flags_from_hf_config
    from slime.models import check_hf_config, hf_args, qwen3
    from slime.utils.arguments import build_parser
    from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_HF_CONFIG

    cfg = {**QWEN3_30B_A3B_HF_CONFIG, "vocab_size": 151936}
    assert qwen3.num_experts({"n_routed_experts": 8}) == 8  # the validation's key list, one definition
    assert hf_args.rope_theta({"rope_parameters": {"rope_theta": 5e5}}) == 5e5
    args = build_parser().parse_args(model_flags_from_hf_config(cfg))
    assert check_hf_config(args, cfg) == []  # HF -> flags (weight maps) agrees with flags -> HF (validation)


def test_weight_map_args_start_from_the_one_hf_key_table():
    """The HF key -> flag table of validation (`hf_shape_args`) is where the weight map's args
    come from: every field it maps reaches `megatron_args` unchanged, for MoE and dense configs,
    and validation's family args (`family_args`) are the registry family's `megatron_args`."""
    from slime.models import ARCHITECTURES, family_args, model_family
    from slime.models.hf_args import hf_shape_args
    from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_HF_CONFIG

    moe = {**QWEN3_30B_A3B_HF_CONFIG, "vocab_size": 151936}
    dense = {k: v for k, v in moe.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}
    for cfg in (moe, dense):
        table = hf_shape_args(cfg)
        assert table and {k: model_family(cfg).megatron_args(cfg)[k] for k in table} == table
        assert family_args(cfg) == ARCHITECTURES["Qwen3MoeForCausalLM"].megatron_args(cfg)
    assert "num_experts" not in hf_shape_args(dense) and "moe_router_topk" not in hf_shape_args(dense)
    assert hf_shape_args({"n_routed_experts": 4, "num_experts_per_tok": 2}) == {"num_experts": 4, "moe_router_topk": 2}
