"""Trainer -> engine weight sync against real local-engine subprocesses.

Each sender (distributed broadcast to two engines, SGLang's tensor payload gathered per engine
over 1 or 2 trainer ranks, HF folder on disk) makes the
engines generate what transformers generates with the new weights (greedy ids equal, log-probs
within 1e-5) and report the new version; the same weights through different paths give
bit-identical engine log-probs. A 2-rank EP=2 Megatron trainer syncs its trained weights with
`MegatronTrainer.update_weights` and --check-weight-update-equal passes, and fails once the
trainer moves on without syncing; so does a PP=2 trainer (two senders under one lock).
"""

import glob
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.backends.megatron_utils.update_weight import (
    UpdateWeightFromDisk,
    UpdateWeightFromDistributed,
    UpdateWeightFromTensor,
)
from slime.backends.megatron_utils.weight_export import bucket_by_bytes
from slime.utils.engine_client import EngineHTTPError, SyncEngineClient
from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data, free_port
from tests.spawn_ranks import spawn_ranks
from tests.unit.backends.megatron_utils.spawn_util import spawn_until_exit

pytestmark = pytest.mark.distributed

PROMPTS = [[3, 14, 15, 92, 65], [27, 18, 28]]
N_NEW = 10
BUCKET = 64 * 1024


@pytest.fixture(scope="module")
def engines(tiny_moe_hf, tmp_path_factory):
    """Two local engines serving the tiny MoE checkpoint."""
    procs, urls = [], []
    for i in range(2):
        port = free_port()
        log = tmp_path_factory.mktemp(f"engine{i}") / "engine.log"
        procs.append(launch_local_engine(tiny_moe_hf, port, extra_args=("--num-threads", "1"), timeout=120,
                                         log_path=str(log)))
        urls.append(f"http://127.0.0.1:{port}")
    yield urls
    for proc in procs:
        stop_local_engine(proc)


def perturbed(src, dst: Path, seed: int) -> dict:
    """Copy checkpoint `src` to `dst` with seeded noise on every tensor; returns the new tensors."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    gen, named = torch.Generator().manual_seed(seed), {}
    for path in sorted(glob.glob(os.path.join(dst, "*.safetensors"))):
        tensors = {k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in load_file(path).items()}
        save_file(tensors, path)
        named.update(tensors)
    return named


def served(url: str) -> list[tuple[list, list, str]]:
    """(greedy output ids, their log-probs, meta weight_version) for each probe prompt."""
    client, out = SyncEngineClient(url), []
    for prompt in PROMPTS:
        res = client.generate({"input_ids": prompt, "return_logprob": True,
                               "sampling_params": {"temperature": 0, "max_new_tokens": N_NEW}})
        lps = [e[0] for e in res["meta_info"]["output_token_logprobs"]]
        out.append((res["output_ids"], lps, res["meta_info"]["weight_version"]))
    return out


def assert_serves(url: str, folder, version: str) -> list:
    """The engine generates what transformers does with the checkpoint in `folder`, at `version`."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert SyncEngineClient(url).get_weight_version() == version
    got = served(url)
    for prompt, (ids, lps, meta_version) in zip(PROMPTS, got):
        assert meta_version == version
        full = torch.tensor([prompt + ids])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0, len(prompt) - 1: -1]
        want = torch.log_softmax(logits.float(), dim=-1)
        assert ids == want.argmax(-1).tolist(), "engine's greedy tokens differ from transformers'"
        torch.testing.assert_close(torch.tensor(lps), want.gather(1, torch.tensor(ids)[:, None])[:, 0],
                                   atol=1e-5, rtol=0)
    return got


def test_distributed_broadcast_reaches_two_engines(engines, tiny_moe_hf, tmp_path):
    before = served(engines[0])
    named = perturbed(tiny_moe_hf, tmp_path / "new", seed=1)
    sender = UpdateWeightFromDistributed(engines, lambda: bucket_by_bytes(sorted(named.items()), BUCKET))
    sender.connect()
    assert sender.update_weights("dist-1") == "dist-1"
    first = [assert_serves(url, tmp_path / "new", "dist-1") for url in engines]
    assert first[0] == first[1], "two engines with the same weights answer differently"
    assert [o[0] for o in first[0]] != [o[0] for o in before]
    assert sender.update_weights() == "2"  # default versions count updates
    assert SyncEngineClient(engines[1]).get_weight_version() == "2"
    sender.disconnect()


def test_distributed_rejected_bucket_raises_instead_of_hanging(engines):
    url = engines[0]
    version = SyncEngineClient(url).get_weight_version()
    bogus = [("model.layers.0.no_such_weight", torch.zeros(3))]
    sender = UpdateWeightFromDistributed([url], lambda: [bogus])
    sender.connect()
    with pytest.raises(EngineHTTPError, match="no_such_weight"):
        sender.update_weights("bogus")
    assert SyncEngineClient(url).get_weight_version() == version
    SyncEngineClient(url).continue_generation()  # a failed sync leaves the engines paused on purpose
    sender.disconnect()


def test_tensor_and_disk_paths_match_each_other_bit_for_bit(engines, tiny_moe_hf, tmp_path):
    named = perturbed(tiny_moe_hf, tmp_path / "new", seed=2)
    tensor = UpdateWeightFromTensor([engines[0]], lambda: bucket_by_bytes(sorted(named.items()), BUCKET))
    tensor.connect()
    tensor.update_weights("tensor-2")
    disk_dir = tmp_path / "sync_dir"
    disk = UpdateWeightFromDisk([engines[1]], lambda: bucket_by_bytes(sorted(named.items()), BUCKET),
                                directory=disk_dir, hf_checkpoint=tiny_moe_hf)
    disk.update_weights("disk-2")
    assert (disk_dir / "config.json").is_file() and (disk_dir / "model.safetensors.index.json").is_file()
    via_tensor = assert_serves(engines[0], tmp_path / "new", "tensor-2")
    via_disk = assert_serves(engines[1], tmp_path / "new", "disk-2")
    assert [o[:2] for o in via_tensor] == [o[:2] for o in via_disk]


def _colocated_worker(rank: int, world: int, port: int, urls: list, named: dict, out: str):
    """Two gloo trainer ranks sync through `UpdateWeightFromTensor`: (a) one engine per rank,
    (b) one engine on both ranks' devices (its gather group has both; rank 1's payload carries a
    bogus name, so the engine must read entry 0, rank 0's), (c) a bucket the engine rejects:
    both ranks raise instead of hanging."""
    import torch.distributed as dist

    from slime.backends.megatron_utils.update_weight import TrainerRole

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    role = TrainerRole(is_leader=rank == 0, is_sender=rank == 0, barrier=dist.barrier)
    good = sorted(named.items())
    mine = good if rank == 0 else [("model.rank1.not_a_weight", good[0][1]), *good[1:]]  # same bucket sizes
    results = {}
    for case, engine_urls, per_engine, items in [("a", urls, 1, good), ("b", urls[:1], 2, mine),
                                                 ("c", urls[:1], 2, [("model.no_such_weight", torch.zeros(2))])]:
        sender = UpdateWeightFromTensor(engine_urls, lambda items=items: bucket_by_bytes(items, BUCKET), role,
                                        gpus_per_engine=per_engine)
        sender.connect()
        try:
            sender.update_weights(f"colo-{case}")
            results[case] = "ok"
        except Exception as exc:  # recorded: case c must fail on both ranks
            results[case] = str(exc)
        sender.disconnect()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_colocated_sender_gathers_per_engine(engines, tiny_moe_hf, tmp_path):
    named = perturbed(tiny_moe_hf, tmp_path / "new", seed=4)
    spawn_until_exit(_colocated_worker, (2, free_port(), engines, named, str(tmp_path)), nprocs=2)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["a"] for r in results] == ["ok", "ok"] and [r["b"] for r in results] == ["ok", "ok"]
    assert "no_such_weight" in results[0]["c"] and "no_such_weight" in results[1]["c"], results
    SyncEngineClient(engines[0]).continue_generation()  # case c left engine 0 paused on purpose
    assert_serves(engines[1], tmp_path / "new", "colo-a")  # rank 1 fed engine 1 alone
    assert_serves(engines[0], tmp_path / "new", "colo-b")  # entry 0 (rank 0's) was read


def _trainer_worker(rank: int, world: int, port: int, hf_dir: str, urls: list, out: str,
                    layout: tuple = ("--expert-model-parallel-size", "2")):
    from slime.backends.megatron_utils.hf_io import read_hf_config, save_hf_checkpoint
    from slime.backends.megatron_utils.parallel import destroy_parallel
    from slime.backends.megatron_utils.update_weight.check import check_engines_match_trainer
    from slime.backends.megatron_utils.weight_export import is_weight_sender, iter_hf_named_tensors

    args, trainer = build_trainer(hf_dir, world, [*layout, "--check-weight-update-equal"], rank, port)
    trainer.train(0, fixed_rollout_data())
    metrics = trainer.update_weights(urls, "trained-1")
    named = dict(iter_hf_named_tensors(trainer.model, read_hf_config(hf_dir), args))
    if is_weight_sender() and args.pipeline_model_parallel_size == 1:
        save_hf_checkpoint(named.items(), Path(out) / "trained", origin_hf_dir=hf_dir)
    trainer.train(1, fixed_rollout_data())  # moves on without syncing: the check must now fail
    try:
        check_engines_match_trainer(trainer, urls)
        stale = "passed"
    except ValueError as exc:
        stale = str(exc)
    if rank == 0:
        (Path(out) / "result.json").write_text(json.dumps({"metrics": metrics, "stale": stale}))
    trainer._weight_sender.disconnect()  # the module's engines serve the next test: drop our group
    # with PP=2 both ranks send and take the lock on rank 0's store: rank 0 must not exit (and end
    # its store) while rank 1 still releases the lock ("Connection reset by peer", seen under load)
    torch.distributed.barrier()
    destroy_parallel()


def test_trainer_update_weights_with_check(engines, tiny_moe_hf, tmp_path):
    spawn_ranks(_trainer_worker, args=(2, free_port(), str(tiny_moe_hf), engines, str(tmp_path)), nprocs=2, join=True)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["metrics"]["check/weight_update_max_abs_logprob_diff"] <= 1e-5
    assert "--check-weight-update-equal" in result["stale"], result["stale"]
    for url in engines:
        assert_serves(url, tmp_path / "trained", "trained-1")


def test_two_pipeline_stages_sync_two_engines(engines, tiny_moe_hf, tmp_path):
    """PP=2 through `MegatronTrainer.update_weights`: each stage's sender has its own group with both
    engines and takes the cluster-wide lock (on the trainer's store) around its transfers; the
    engines then compute what the trainer computes (--check-weight-update-equal). The ordering the
    lock guarantees is tested in tests/unit/.../test_weight_sync_lock.py (the local engine did not
    deadlock here without it)."""
    layout = ("--pipeline-model-parallel-size", "2")
    spawn_ranks(_trainer_worker, args=(2, free_port(), str(tiny_moe_hf), engines, str(tmp_path), layout),
             nprocs=2, join=True)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["metrics"]["check/weight_update_max_abs_logprob_diff"] <= 1e-5
    assert "--check-weight-update-equal" in result["stale"], result["stale"]
