"""Plugins through the real Megatron trainer (1 gloo rank, tiny MoE): call sites and signatures.

`--rollout-data-postprocess-path` runs after log-probs and advantages exist; a slime-style custom
TIS function gets `args=` by keyword (with --use-tis); a slime-style pg-loss reducer factory is
built per micro-batch; the before-log-prob hook runs before each old-policy pass; custom advantage and custom loss functions
drive a real optimizer step; the SFT loss trains too.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.distributed.megatron_harness import train_metrics

P = "tests.distributed.trainer_plugins"


def _probe(monkeypatch, tmp_path):
    path = tmp_path / "probe.jsonl"
    monkeypatch.setenv("SLIME_PLUGIN_PROBE", str(path))
    return lambda: [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_postprocess_advantage_and_tis_hooks(tiny_moe_hf, tmp_path, monkeypatch):
    seen = _probe(monkeypatch, tmp_path)
    extra = ["--rollout-data-postprocess-path", f"{P}.postprocess", "--custom-advantage-function-path",
             f"{P}.advantage", "--use-tis", "--use-rollout-logprobs", "--custom-tis-function-path", f"{P}.tis",
             "--custom-megatron-before-train-step-hook-path", f"{P}.before_step", "--global-batch-size", "2",
             "--custom-pg-loss-reducer-function-path", f"{P}.pg_reducer"]
    runs = train_metrics(tiny_moe_hf, 1, extra, tmp_path, rollouts=2, tag="hooks", with_rollout_log_probs=True)
    metrics = runs[0]
    steps = [(e["rollout_id"], e["step_id"]) for e in seen() if e["hook"] == "before_step"]
    assert steps == [(0, 0), (0, 1), (1, 0), (1, 1)]  # step_id counts within the rollout, as in slime
    hooks = [e["hook"] for e in seen() if e["hook"] != "before_step"]
    assert hooks.index("advantage") < hooks.index("postprocess") < hooks.index("tis")
    post = next(e for e in seen() if e["hook"] == "postprocess")
    assert [e["rollout_id"] for e in seen() if e["hook"] == "postprocess"] == [0, 1]
    assert post["rollout_id"] == 0 and post["present"] == ["log_probs", "advantages", "returns"]
    assert all(e["has_args"] for e in seen() if e["hook"] == "tis")
    reducers = [e for e in seen() if e["hook"] == "pg_reducer"]  # one per micro-batch loss
    assert reducers and all(e["samples"] >= 1 and e["per_token"] is False for e in reducers)
    assert metrics["train/probe"] == pytest.approx(1.0) and math.isfinite(metrics["train/loss"])


@pytest.mark.parametrize("loss_flags", [["--loss-type", "custom_loss", "--custom-loss-function-path", f"{P}.loss", "--lr", "1e-3"],
                                        ["--loss-type", "sft_loss"]], ids=["custom_loss", "sft_loss"])
def test_custom_and_sft_loss_train(loss_flags, tiny_moe_hf, tmp_path, monkeypatch):
    seen = _probe(monkeypatch, tmp_path)
    flags = loss_flags + ["--custom-megatron-before-log-prob-hook-path", f"{P}.before_log_prob"]
    runs = train_metrics(tiny_moe_hf, 1, flags, tmp_path, rollouts=2, tag=loss_flags[1])
    assert runs[1]["train/loss"] < runs[0]["train/loss"]  # the loss on a fixed batch goes down
    passes = [(e["store_prefix"], e["chunks"]) for e in seen() if e["hook"] == "before_log_prob"]
    assert passes == [("", 1), ("", 1)]  # the old-policy pass of each rollout (no reference model)
    if "custom_loss" in loss_flags:
        calls = [e for e in seen() if e["hook"] != "before_log_prob"]
        assert {e["hook"] for e in calls} == {"loss"} and "train/custom" in runs[0]
        assert calls[0]["keys"] == ["advantages", "log_probs", "loss_masks"]
