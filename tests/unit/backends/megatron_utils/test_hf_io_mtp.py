"""An HF export's config.json declares the multi-token-prediction layers it holds: the trainer
builds none, so GLM-4.5-Air's released `num_nextn_predict_layers: 1` becomes 0 (SGLang's NextN /
EAGLE draft would otherwise look for layer 46); an export that does carry layer 46 keeps 1."""

import json
import shutil

import torch

from slime.backends.megatron_utils.hf_io import read_hf_config, save_hf_checkpoint


def test_export_config_counts_the_mtp_layers_written(repo_root, tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    shutil.copyfile(repo_root / "tests" / "data" / "hf-configs" / "GLM-4.5-Air" / "config.json",
                    origin / "config.json")
    released = json.loads((origin / "config.json").read_text())
    assert released["num_nextn_predict_layers"] == 1 and released["num_hidden_layers"] == 46

    decoder = [("model.norm.weight", torch.ones(2)), ("model.layers.45.input_layernorm.weight", torch.ones(2))]
    out = save_hf_checkpoint(decoder, tmp_path / "no_mtp", origin_hf_dir=origin)
    written = read_hf_config(out)
    assert written["num_nextn_predict_layers"] == 0
    assert {k: v for k, v in written.items() if k != "num_nextn_predict_layers"} == \
        {k: v for k, v in released.items() if k != "num_nextn_predict_layers"}

    with_mtp = decoder + [("model.layers.46.eh_proj.weight", torch.ones(2, 2))]
    out = save_hf_checkpoint(with_mtp, tmp_path / "mtp", origin_hf_dir=origin)
    assert (out / "config.json").read_bytes() == (origin / "config.json").read_bytes()  # unchanged
