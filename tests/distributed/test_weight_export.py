"""HF export from a sharded trainer: the union of what the sending ranks get from
`iter_hf_buckets` is the HF checkpoint bit for bit (fp32), for one rank, for EP=2, TP=2 and PP=2
on two gloo ranks and TP=2 x EP=2 (expert-TP 2) on four; buckets respect the byte limit, and
expert weights are gathered once per layer."""

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.megatron_harness import build_trainer, free_port
from tests.spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed

BUCKET_BYTES = 40_000  # a few tiny-model tensors per bucket (the embedding alone is 32 KiB)


def _export_worker(rank: int, world: int, port: int, hf_dir: str, extra: list, out: str,
                   bucket_bytes: int = BUCKET_BYTES):
    from safetensors.torch import save_file

    from slime.backends.megatron_utils.hf_io import read_hf_config
    from slime.backends.megatron_utils.parallel import destroy_parallel
    from slime.backends.megatron_utils.weight_export import is_weight_sender, iter_hf_buckets

    from slime.backends.megatron_utils import collectives
    from slime.backends.megatron_utils.parallel import megatron_parallel_state

    args, trainer = build_trainer(hf_dir, world, extra, rank, port)
    ep_group, all_gather, ep_gathers = megatron_parallel_state().get_expert_model_parallel_group(), collectives.all_gather, []

    def counting_all_gather(tensor, group=None):
        ep_gathers.extend([group] if group is ep_group else [])
        return all_gather(tensor, group)

    collectives.all_gather = counting_all_gather
    buckets = list(iter_hf_buckets(trainer.model, read_hf_config(hf_dir), args, bucket_bytes))
    collectives.all_gather = all_gather
    (Path(out) / f"ep_gathers{rank}.txt").write_text(str(len(ep_gathers)))
    if is_weight_sender():
        named = {name: t for bucket in buckets for name, t in bucket}
        assert len(named) == sum(len(b) for b in buckets), "a tensor name was sent twice by one rank"
        save_file(named, str(Path(out) / f"rank{rank}.safetensors"))
        sizes = [[[name, t.numel() * t.element_size()] for name, t in b] for b in buckets]
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(sizes))
    destroy_parallel()


def exported(hf_dir, world: int, extra: list, out: Path, bucket_bytes: int = BUCKET_BYTES) -> tuple[dict, list]:
    """(name -> tensor over all sending ranks, every sender's buckets as lists of [name, bytes])."""
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    spawn_ranks(_export_worker, args=(world, free_port(), str(hf_dir), extra, str(out), bucket_bytes), nprocs=world, join=True)
    union, sizes = {}, []
    for path in sorted(out.glob("rank*.safetensors")):
        part = load_file(str(path))
        assert not set(part) & set(union), f"{path.name} repeats tensors another sender sent"
        union.update(part)
        sizes += json.loads(path.with_suffix(".json").read_text())
    return union, sizes


def assert_equals_checkpoint(union: dict, hf_dir) -> None:
    """Same names as the checkpoint, each tensor fp32 and bit-identical."""
    from slime.backends.megatron_utils.hf_io import HFCheckpoint

    ckpt = HFCheckpoint(hf_dir)
    assert sorted(union) == sorted(ckpt.keys())
    for name in ckpt.keys():
        want = ckpt.get(name)
        assert union[name].dtype == want.dtype == torch.float32, name
        assert torch.equal(union[name], want), f"{name} differs from the HF checkpoint"


LAYOUTS = {
    "one-rank-moe": ("moe", 1, []),
    "ep2-moe": ("moe", 2, ["--expert-model-parallel-size", "2"]),
    # expert-TP 2 (= TP) times EP 2: experts are gathered over both groups
    "tp2-ep2-moe": ("moe", 4, ["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                               "--sequence-parallel"]),
    "tp2-dense": ("dense", 2, ["--tensor-model-parallel-size", "2"]),
    "pp2-moe": ("moe", 2, ["--pipeline-model-parallel-size", "2"]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_union_of_senders_is_the_hf_checkpoint(layout, tiny_moe_hf, tiny_dense_hf, tmp_path):
    model, world, extra = LAYOUTS[layout]
    hf = tiny_moe_hf if model == "moe" else tiny_dense_hf
    union, sizes = exported(hf, world, extra, tmp_path / "out")
    assert_equals_checkpoint(union, hf)
    expected_senders = 2 if "--pipeline-model-parallel-size" in extra else 1
    assert len(list((tmp_path / "out").glob("rank*.json"))) == expected_senders
    assert any(len(b) > 1 for b in sizes), "bucketing never grouped tensors"
    for bucket in sizes:
        total = sum(nbytes for _, nbytes in bucket)
        assert len(bucket) == 1 or total <= BUCKET_BYTES, f"bucket of {total} bytes"
    if "--expert-model-parallel-size" in extra:  # one expert gather per MoE layer (2), not one per weight
        assert {(tmp_path / "out" / f"ep_gathers{r}.txt").read_text() for r in range(world)} == {"2"}


def test_mla_halves_share_a_bucket(tiny_deepseek_v3_hf, tmp_path):
    """SGLang fuses q_a_proj with kv_a_proj_with_mqa only when both arrive in one load_weights call
    (it drops a lone half silently): with buckets too small for any two tensors, each layer's
    halves still travel together, and nothing else is grouped."""
    union, buckets = exported(tiny_deepseek_v3_hf, 1, [], tmp_path / "out", bucket_bytes=1)
    assert_equals_checkpoint(union, tiny_deepseek_v3_hf)
    names = [[name for name, _ in bucket] for bucket in buckets]
    halves = [n for n in union if "q_a_proj." in n or "kv_a_proj_with_mqa." in n]
    assert halves, "the tiny DeepSeek-V3 has no MLA down projections"
    for name in halves:
        (bucket,) = [b for b in names if name in b]
        assert sorted(bucket) == sorted([name.replace("kv_a_proj_with_mqa.", "q_a_proj."),
                                         name.replace("q_a_proj.", "kv_a_proj_with_mqa.")]), bucket
    assert all(len(b) == 1 for b in names if not set(b) & set(halves))


def test_bucket_by_bytes_limits_and_order():
    from slime.backends.megatron_utils.weight_export import bucket_by_bytes

    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([2, 2, 10, 1, 1, 1])]
    buckets = list(bucket_by_bytes(named, 16))
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"]]
    with pytest.raises(ValueError, match="update-weight-buffer-size"):
        list(bucket_by_bytes(named, 0))


def test_bucket_by_bytes_keeps_fused_sets_together_and_refuses_a_lone_half():
    from slime.backends.megatron_utils.weight_export import bucket_by_bytes
    from slime.models import fused_groups

    groups = fused_groups({"architectures": ["DeepseekV3ForCausalLM"], "q_lora_rank": 8})
    assert fused_groups({"architectures": ["DeepseekV3ForCausalLM"], "q_lora_rank": None}) == ()
    q, kv = "model.layers.1.self_attn.q_a_proj.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    named = [("a", torch.zeros(2)), (q, torch.zeros(2)), ("b", torch.zeros(2)), (kv, torch.zeros(2))]
    buckets = [[n for n, _ in b] for b in bucket_by_bytes(named, 16, groups)]
    assert buckets == [["a", "b"], [q, kv]]
    with pytest.raises(ValueError, match="kv_a_proj_with_mqa"):
        list(bucket_by_bytes(named[:3], 16, groups))
