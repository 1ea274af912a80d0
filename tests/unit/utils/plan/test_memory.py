"""Trainer memory, host RAM and precision rules on a small dense model computed by hand."""

from argparse import Namespace

import pytest

from slime.utils.plan.layout import layout_from_args
from slime.utils.plan.memory import (
    FRAGMENTATION,
    GIB,
    RESERVE_GIB,
    dtype_bytes,
    host_memory,
    precision_from_args,
    stage_memories,
    trainer_memory,
)
from slime.utils.plan.model import shape_from_args

PARAMS = 98_176  # the small dense shape of test_model.test_small_dense_shape_by_hand
LAYER_BYTES = 19_360  # one layer's activations for 10 tokens, see test_activations_by_hand


def _args(**kw):
    base = dict(num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
                kv_channels=16, vocab_size=100, untie_embeddings_and_output_weights=False, swiglu=False,
                normalization="LayerNorm", add_bias_linear=True, num_experts=None,
                actor_num_nodes=1, actor_num_gpus_per_node=4, num_gpus_per_node=4, colocate=False,
                tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                expert_model_parallel_size=1, expert_tensor_parallel_size=None, sequence_parallel=False,
                bf16=True, fp16=False, accumulate_allreduce_grads_in_fp32=False, use_distributed_optimizer=True,
                optimizer_cpu_offload=False, use_precision_aware_optimizer=False, recompute_granularity=None,
                use_dynamic_batch_size=False, max_tokens_per_gpu=None, micro_batch_size=1,
                rollout_max_response_len=10, rollout_max_prompt_len=None, gpu_memory_gib=80.0, host_memory_gib=None)
    base.update(kw)
    return Namespace(**base)


def _memory(**kw):
    args = _args(**kw)
    return trainer_memory(args, shape_from_args(args), layout_from_args(args))


def test_activations_by_hand():
    # Per token, TP1, flash attention: norm input + QKV input 2*2*64 = 256; q,k,v 2*(4+2*2)*16 = 256;
    # core attention output 2*4*16 + fp32 lse 4*4 = 144; MLP: norm + fc1 inputs 256, fc1 out +
    # activation 2*(256+256) = 1024. 1936 B/token x 10 tokens = 19,360 per layer.
    assert _memory().parts["activations"] == 2 * LAYER_BYTES
    # Selective drops core attention (144 * 10 per layer).
    assert _memory(recompute_granularity="selective").parts["activations"] == 2 * (LAYER_BYTES - 1440)
    # Full uniform, 1 layer: two checkpointed inputs (2*64*10 each) + one recomputed layer.
    full = _memory(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    assert full.parts["activations"] == 2 * 1280 + LAYER_BYTES
    block = _memory(recompute_granularity="full", recompute_method="block", recompute_num_layers=1)
    assert block.parts["activations"] == 1280 + LAYER_BYTES


def test_trainer_memory_by_hand():
    mem = _memory()
    assert mem.parts["weights"] == 2 * PARAMS
    assert mem.parts["gradient buffer"] == 2 * PARAMS
    assert mem.parts["optimizer states"] == 12 * PARAMS // 4  # fp32 master + 2 moments, sharded over DP 4
    # Logits: 10 tokens x 100 vocab x 4 B x 2, plus final-norm and output-layer inputs 2 * 2*64*10.
    assert mem.parts["logits"] == 8_000 + 2_560
    tensors = 4 * PARAMS + 3 * PARAMS + 2 * LAYER_BYTES + 10_560
    assert mem.parts["allocator fragmentation"] == int(FRAGMENTATION * tensors)
    assert mem.parts["fixed reserve"] == int(sum(RESERVE_GIB.values()) * GIB)
    assert mem.fits and mem.total < mem.budget


def test_optimizer_rules():
    assert _memory(use_distributed_optimizer=False).parts["optimizer states"] == 12 * PARAMS
    fp32 = _memory(bf16=False)
    assert (fp32.parts["weights"], fp32.parts["gradient buffer"]) == (4 * PARAMS, 4 * PARAMS)
    assert fp32.parts["optimizer states"] == 8 * PARAMS // 4  # no master copy in fp32 training
    assert _memory(accumulate_allreduce_grads_in_fp32=True).parts["gradient buffer"] == 4 * PARAMS
    aware = _memory(use_precision_aware_optimizer=True, main_params_dtype="fp32", exp_avg_dtype="bf16",
                    exp_avg_sq_dtype="bf16", main_grads_dtype="fp32")
    assert aware.parts["optimizer states"] == 8 * PARAMS // 4


def test_cpu_offload_moves_states_and_implies_distributed_optimizer():
    args = _args(optimizer_cpu_offload=True, use_distributed_optimizer=False, host_memory_gib=1.0)
    mem = trainer_memory(args, shape_from_args(args), layout_from_args(args))
    assert mem.parts["optimizer states"] == 0 and mem.optimizer_on_cpu == 12 * PARAMS // 4
    host = host_memory(args, mem)
    assert host.per_rank == 16 * (PARAMS // 4) and host.per_node == 4 * host.per_rank and host.fits
    assert host_memory(_args(), _memory()) is None
    half = _args(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    mem = trainer_memory(half, shape_from_args(half), layout_from_args(half))
    assert mem.parts["optimizer states"] == mem.optimizer_on_cpu == 6 * PARAMS // 4


def test_pipeline_worst_stage():
    args = _args(pipeline_model_parallel_size=2)
    first, last = stage_memories(args, shape_from_args(args), layout_from_args(args))
    # 1F1B: stage 0 holds PP=2 micro-batches of its one layer; the last stage holds one, plus logits.
    assert first.parts["activations"] == 2 * LAYER_BYTES and first.parts["logits"] == 0
    assert last.parts["activations"] == LAYER_BYTES and last.parts["logits"] == 10_560
    worst = trainer_memory(args, shape_from_args(args), layout_from_args(args))
    assert worst.total == max(first.total, last.total)


def test_colocated_reserve_and_budget_verdict():
    assert _memory(colocate=True).parts["fixed reserve"] > _memory().parts["fixed reserve"]
    assert not _memory(gpu_memory_gib=1.0).fits


def test_dtype_names():
    assert dtype_bytes(None) == 4 and dtype_bytes("torch.bfloat16") == 2 and dtype_bytes("fp8") == 1
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("int3")
    assert precision_from_args(_args(fp16=True, bf16=False)).weight == 2


def test_render_verdict_marks_tight_margins():
    from slime.utils.plan.render import verdict

    assert verdict(50 * GIB, 80 * GIB) == "fits (50.0 of 80.0 GiB, 30.0 GiB free)"
    assert "tight" in verdict(75 * GIB, 80 * GIB)
    assert verdict(81 * GIB, 80 * GIB).startswith("OVER BUDGET (81.0 of 80.0 GiB, 1.0 GiB over)")
