"""Verdicts of the Qwen3-30B-A3B recipe on 80 GiB H100s, built from the real parse_args."""

import re

import pytest

from slime.utils.plan import build_plan, render_plan
from slime.utils.plan.memory import GIB
from tests.unit.utils.plan.conftest import CPU_ADAM_FLAGS


def _verdict(text: str, name: str) -> str:
    match = re.search(rf"^\s*{name} verdict\s*: (.*)$", text, re.MULTILINE)
    assert match, f"no '{name} verdict' line in:\n{text}"
    return match.group(1)


def test_one_node_fits_with_cpu_adam(qwen3_args):
    plan = build_plan(qwen3_args())
    assert plan.trainer.fits
    assert plan.layout.dp == 2 and plan.layout.expert_dp == 1
    # With CPU Adam the GPU keeps bf16 weights (2 B) and the fp32 grad buffer (4 B) only.
    assert plan.trainer.parts["optimizer states"] == 0
    assert plan.trainer.optimizer_on_cpu > 40 * GIB
    assert _verdict(render_plan(plan), "trainer").startswith("fits")


@pytest.mark.parametrize("distributed", [False, True])
def test_one_node_over_budget_without_cpu_adam(qwen3_args, distributed):
    extra = ["--use-distributed-optimizer"] if distributed else []
    plan = build_plan(qwen3_args(drop=CPU_ADAM_FLAGS, extra=extra))
    assert not plan.trainer.fits
    # Expert-DP is 1 on one node: every rank keeps 12 B/param of Adam state for 3.6B expert params.
    assert plan.trainer.parts["optimizer states"] > 40 * GIB
    assert _verdict(render_plan(plan), "trainer").startswith("OVER BUDGET")


def test_four_nodes_fit_with_distributed_optimizer(qwen3_args):
    extra = ["--use-distributed-optimizer"]
    argv_nodes = ["--actor-num-nodes", "4"]
    plan = build_plan(qwen3_args(drop=CPU_ADAM_FLAGS, extra=extra + argv_nodes))
    assert plan.layout.world_size == 32 and plan.layout.dp == 8 and plan.layout.expert_dp == 4
    assert plan.host is None
    assert plan.trainer.fits
    assert _verdict(render_plan(plan), "trainer").startswith("fits")


def test_host_ram_per_node_for_cpu_adam(qwen3_args):
    plan = build_plan(qwen3_args())
    # By hand: per GPU, dense = (embedding + output + attention linears) / TP4 + norms and routers
    #   = (2 * 151936*2048 + 48 * 18,874,368) / 4 + 48 * (2*2048 + 2*128 + 128*2048) + 2048
    #   = 1,528,299,520 / 4 + 48 * 266,496 + 2048 = 382,074,880 + 12,793,856 = 394,868,736;
    # experts = 48 * 128 * 3*2048*768 / EP8 = 3,623,878,656.
    # A rank owns dense / DP2 + experts / expert-DP1 = 3,821,313,024 params; CPU Adam keeps
    # 4 (fp32 master) + 4 + 4 (moments) + 4 (fp32 grad) = 16 B each = 56.94 GiB; x 8 ranks = 455.5 GiB.
    assert plan.trainer.owned_params == 3_821_313_024
    assert plan.host.per_rank == 16 * 3_821_313_024
    assert plan.host.per_node / GIB == pytest.approx(455.54, abs=0.01)
    assert "not checked" in _verdict(render_plan(plan), "host")


@pytest.mark.parametrize("budget, expected", [("1024", "fits"), ("256", "OVER BUDGET")])
def test_host_ram_verdict_against_budget(qwen3_args, budget, expected):
    plan = build_plan(qwen3_args(extra=["--host-memory-gib", budget]))
    assert _verdict(render_plan(plan), "host").startswith(expected)
    assert plan.fits == (expected == "fits")


def test_engine_memory_bf16_and_fp8(qwen3_args):
    bf16 = build_plan(qwen3_args()).engine
    fp8 = build_plan(qwen3_args(extra=["--sglang-quantization", "fp8"])).engine
    # tp8 over one engine: attention and experts split 8 ways, 2 B/param -> ~7.1 GiB of weights.
    assert bf16.weight_dtype == "bf16" and bf16.weights / GIB == pytest.approx(7.13, abs=0.05)
    assert fp8.weight_dtype == "fp8" and fp8.weights < 0.6 * bf16.weights
    # 4 KV heads over attention-tp 8: one head per GPU (replicated), 48 layers x K,V x 128 x 2 B.
    assert bf16.kv_bytes_per_token == 2 * 48 * 1 * 128 * 2
    assert bf16.reserved == int(0.7 * 80 * GIB) and bf16.fits


def test_dp_attention_keeps_whole_kv_heads(qwen3_args):
    plan = build_plan(qwen3_args(extra=["--sglang-enable-dp-attention", "--sglang-dp-size", "8"]))
    assert plan.placement.engines[0].dp == 8 and plan.engine.attention_tp == 1
    assert plan.engine.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    # By hand: embedding whole (311,164,928) + output / 8 (38,895,616) + final norm 2048 + 48 layers x
    # (attention 18,874,368 whole + norms 4,352 + router 262,144 + experts 603,979,776 / 8) = 4,892,702,720
    # parameters x 2 B.
    assert plan.engine.weights == 2 * 4_892_702_720


def test_render_has_every_section_and_no_secret(qwen3_args):
    args = qwen3_args(extra=["--use-wandb", "--wandb-key", "SECRET-KEY-123"])
    args.warnings.append("a warning from validation")
    text = render_plan(build_plan(args))
    for title in ("Placement", "Parallel layout", "Batch arithmetic", "Memory per trainer GPU",
                  "Host RAM per node", "Engine memory", "Warnings"):
        assert f"== {title}" in text
    assert "a warning from validation" in text
    assert "SECRET-KEY-123" not in text


def test_parameter_count_matches_qwen3_30b_a3b(qwen3_args):
    plan = build_plan(qwen3_args())
    # Qwen3-30B-A3B: 30.5B parameters in total, 3.3B activated per token.
    assert plan.params.total == pytest.approx(30.5e9, rel=0.01)
    assert plan.active_params == pytest.approx(3.3e9, rel=0.03)
    assert plan.params.expert == 48 * 128 * 3 * 2048 * 768
