"""HF -> torch_dist -> HF on one rank is bit-identical; the layout is Megatron-LM's; mismatches refused."""

import json

import pytest
import torch

from tests.unit.backends.megatron_utils.convert_util import (
    TINY_DENSE_ARGS,
    TINY_MOE_ARGS,
    assert_same_weights,
    round_trip,
)


def test_moe_round_trip_one_rank_and_layout(tiny_moe_hf, tmp_path):
    out = round_trip(tiny_moe_hf, tmp_path, TINY_MOE_ARGS)
    assert assert_same_weights(tiny_moe_hf, out) == 2 * (9 + 3 * 8) + 3
    save = tmp_path / "torch_dist"
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "0"
    assert (save / "iter_0000000" / "metadata.json").is_file()
    common = torch.load(save / "iter_0000000" / "common.pt", weights_only=False)
    assert common["iteration"] == 0 and common["checkpoint_version"] == 3.0
    assert common["args"].num_layers == 2
    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(str(save / "iter_0000000")).read_metadata().state_dict_metadata)
    # TE-compatible keys: fused qkv norm name, separate MoE pre-MLP norm, experts by global id.
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in keys
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in keys
    assert "decoder.layers.0.mlp.experts.experts.linear_fc1.weight" in keys
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (tiny_moe_hf / name).read_bytes(), name


def test_dense_round_trip_one_rank_with_model_args_on_export(tiny_dense_hf, tmp_path):
    out = round_trip(tiny_dense_hf, tmp_path, TINY_DENSE_ARGS, export_args=TINY_DENSE_ARGS)
    assert assert_same_weights(tiny_dense_hf, out) == 2 * 11 + 3
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


def test_converter_refuses_mismatched_model_args(tiny_moe_hf, tmp_path):
    from slime.backends.megatron_utils.hf_convert import (
        convert_hf_to_torch_dist,
        parse_hf_to_torch_dist_args,
    )

    argv = [*TINY_MOE_ARGS, "--hf-checkpoint", str(tiny_moe_hf), "--save", str(tmp_path / "x")]
    argv[argv.index("--num-layers") + 1] = "3"
    argv[argv.index("--moe-layer-freq") + 1] = "[1, 1, 1]"
    args = parse_hf_to_torch_dist_args(argv)
    with pytest.raises(ValueError) as err:
        convert_hf_to_torch_dist(args)
    assert "--num-layers 3" in str(err.value) and "num_hidden_layers=2" in str(err.value)
    assert not (tmp_path / "x").exists()


def test_bf16_checkpoint_exports_in_hf_dtype(tiny_moe_hf, tmp_path):
    from safetensors.torch import load_file

    out = round_trip(tiny_moe_hf, tmp_path, [*TINY_MOE_ARGS, "--bf16"])
    origin = load_file(str(tiny_moe_hf / "model.safetensors"))
    back = load_file(str(out / "model.safetensors"))
    assert back.keys() == origin.keys()
    for name, tensor in origin.items():
        assert back[name].dtype == torch.float32, name  # config.json says float32
        assert torch.equal(back[name], tensor.to(torch.bfloat16).float()), name
