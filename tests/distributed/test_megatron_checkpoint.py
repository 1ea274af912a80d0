"""Trainer checkpoints on gloo: resume gives the uninterrupted run's next step, RNG states round
trip, the Megatron-LM layout, --no-save-optim, an EP=2 --async-save resumed, an EP=2 save (no
hang) loaded with EP=1, slime's converted `release` checkpoints, and a resume of a checkpoint
written in Megatron-LM's own (pre-0.14) layout."""

import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data, free_port
from tests.spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed

SPAWN_TIMEOUT_S = 300  # a hang guard: loaded 2-core machines took 77 s for one save


def _spawn(fn, world: int, *args) -> None:
    """Run fn(rank, world, port, *args) on `world` processes; fail (and kill them) after the timeout."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = spawn_ranks(fn, args=(world, free_port()) + args, nprocs=world, join=False)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"{fn.__name__} on {world} ranks did not finish in {SPAWN_TIMEOUT_S} s (hang?)")


def _draws() -> dict:
    from megatron.core import tensor_parallel

    with tensor_parallel.get_cuda_rng_tracker().fork():
        tracked = torch.rand(3).tolist()
    return {"torch": torch.rand(3).tolist(), "numpy": np.random.rand(3).tolist(),
            "python": [random.random() for _ in range(3)], "tracker": tracked}


def _finish(rank: int, out: str, result: dict) -> None:
    from slime.backends.megatron_utils.parallel import destroy_parallel

    if rank == 0:
        Path(out).write_text(json.dumps(result))
    destroy_parallel()


def _straight_worker(rank, world, port, hf, ckpt, extra, out):
    """Rollout 0, RNG draws (moving every stream off its seed), save, RNG draws, rollouts 1, 2."""
    args, trainer = build_trainer(hf, world, ["--save", ckpt] + extra, rank, port)
    trainer.train(0, fixed_rollout_data())
    _draws()
    trainer.save(0)
    draws = _draws()
    _finish(rank, out, {"draws": draws, "next": [trainer.train(i, fixed_rollout_data()) for i in (1, 2)]})


def _resume_worker(rank, world, port, hf, ckpt, extra, out):
    """Resume from the checkpoint: RNG draws, rollouts 1, 2 (2 shows the loaded optimizer state)."""
    args, trainer = build_trainer(hf, world, ["--load", ckpt] + extra, rank, port)
    start = trainer.load_initial_state()
    draws = _draws()
    result = {"start": start, "step_id": trainer.step_id, "draws": draws,
              "next": [trainer.train(i, fixed_rollout_data()) for i in (1, 2)]}
    _finish(rank, out, result)


def _draws_worker(rank, world, port, hf, ckpt, extra, out):
    """Start from the checkpoint and draw from every RNG."""
    args, trainer = build_trainer(hf, world, ["--load", ckpt] + extra, rank, port)
    trainer.load_initial_state()
    _finish(rank, out, {"draws": _draws()})


def _assert_same_steps(got: list, want: list) -> None:
    for k, (g, w) in enumerate(zip(got, want)):
        for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/ppo_kl", "train/lr"):
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-9), f"rollout {k + 1}: {key}"


def _run(fn, world, tmp_path, hf, ckpt, extra, tag) -> dict:
    out = Path(tmp_path) / f"{tag}.json"
    _spawn(fn, world, str(hf), str(ckpt), extra, str(out))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def straight(tiny_moe_hf, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    ckpt = tmp / "save"
    return ckpt, _run(_straight_worker, 1, tmp, tiny_moe_hf, ckpt, [], "straight")


def test_layout_tracker_and_iteration_folder(straight):
    ckpt, _ = straight
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "0"
    assert (ckpt / "iter_0000000" / "metadata.json").is_file()
    assert sorted(p.name for p in ckpt.iterdir()) == ["iter_0000000", "latest_checkpointed_iteration.txt"]


def test_files_hold_tensors_not_whole_buffers(straight, tiny_moe_hf):
    """Weights + the distributed optimizer's fp32 main parameters and two Adam moments (fp32 like
    the HF file, bucket-padded): about 4.7x the HF weights (seen: 2.69 MB for 0.57 MB), well
    under what writing whole shared buffers gives (every parameter view writing its whole
    buffer: ~40x seen with EP=2 and the distributed optimizer)."""
    ckpt, _ = straight
    written = sum(p.stat().st_size for p in (ckpt / "iter_0000000").glob("*.distcp"))
    weights = sum(p.stat().st_size for p in tiny_moe_hf.glob("*.safetensors"))
    assert written < 6 * weights, (written, weights)


def test_resume_matches_uninterrupted_run(straight, tiny_moe_hf, tmp_path):
    ckpt, want = straight
    got = _run(_resume_worker, 1, tmp_path, tiny_moe_hf, ckpt, [], "resume")
    assert got["start"] == 1 and got["step_id"] == 1
    _assert_same_steps(got["next"], want["next"])


def test_two_rank_resume_matches_uninterrupted_run(tiny_moe_hf, tmp_path):
    """EP=2 with the distributed optimizer: save/resume on 2 ranks gives the same next step. The
    save is an `--async-save` (written by a thread, finished by the next train call): the
    checkpoint is complete once finished."""
    extra = ["--expert-model-parallel-size", "2", "--use-distributed-optimizer"]
    want = _run(_straight_worker, 2, tmp_path, tiny_moe_hf, tmp_path / "save", extra + ["--async-save"], "straight2")
    got = _run(_resume_worker, 2, tmp_path, tiny_moe_hf, tmp_path / "save", extra, "resume2")
    assert got["start"] == 1 and got["draws"] == want["draws"]
    _assert_same_steps(got["next"], want["next"])


def _adam_steps(trainer) -> list[float]:
    """The distinct torch-Adam `step` values of the trainer's optimizer states."""
    from slime.backends.megatron_utils.offload import _inner_optimizers

    return sorted({float(s["step"]) for opt in _inner_optimizers(trainer.state.optimizer)
                   for s in opt.state.values() if "step" in s})


def _two_steps_save_worker(rank, world, port, hf, ckpt, extra, out):
    args, trainer = build_trainer(hf, world, ["--save", ckpt] + extra, rank, port)
    trainer.train(0, fixed_rollout_data())
    trainer.train(1, fixed_rollout_data())
    trainer.save(1)
    _finish(rank, out, {"steps": _adam_steps(trainer)})


def _loaded_steps_worker(rank, world, port, hf, ckpt, extra, out):
    args, trainer = build_trainer(hf, world, ["--load", ckpt] + extra, rank, port)
    trainer.load_initial_state()
    _finish(rank, out, {"steps": _adam_steps(trainer)})


def test_resume_restores_adam_step_count(tiny_moe_hf, tmp_path):
    """A checkpoint saved after two optimizer steps resumes at Adam step 2 (the distributed
    optimizer's parameter states once handed back the fresh optimizer's step 1: the resumed run's
    bias correction, and every step after the first, differed; resumes saved after one step could
    not show it)."""
    saved = _run(_two_steps_save_worker, 1, tmp_path, tiny_moe_hf, tmp_path / "save", [], "saved_steps")
    loaded = _run(_loaded_steps_worker, 1, tmp_path, tiny_moe_hf, tmp_path / "save", [], "loaded_steps")
    assert saved["steps"] == [2.0] and loaded["steps"] == [2.0], (saved, loaded)


def test_rng_states_round_trip(straight, tiny_moe_hf, tmp_path):
    ckpt, want = straight
    got = _run(_draws_worker, 1, tmp_path, tiny_moe_hf, ckpt, ["--no-load-optim"], "rng")
    assert got["draws"] == want["draws"]
    fresh = _run(_draws_worker, 1, tmp_path, tiny_moe_hf, ckpt, ["--no-load-optim", "--no-load-rng"], "norng")
    assert fresh["draws"] != want["draws"]  # the seeded streams, not the saved ones


def _no_optim_worker(rank, world, port, hf, ckpt, extra, out):
    from megatron.core import dist_checkpointing

    args, trainer = build_trainer(hf, world, ["--save", ckpt, "--no-save-optim"], rank, port)
    trainer.save(3)
    keys = sorted(dist_checkpointing.load_tensors_metadata(str(Path(ckpt) / "iter_0000003")))
    args.load, args.no_load_optim = ckpt, False
    try:
        trainer.load_initial_state()
        error = ""
    except ValueError as err:
        error = str(err)
    _finish(rank, out, {"keys": keys, "error": error})


def test_no_save_optim_omits_optimizer(tiny_moe_hf, tmp_path):
    got = _run(_no_optim_worker, 1, tmp_path, tiny_moe_hf, tmp_path / "save", [], "noopt")
    assert got["keys"] and not [k for k in got["keys"] if "optimizer" in k]
    assert "--no-load-optim" in got["error"]


def _ep_save_worker(rank, world, port, hf, ckpt, extra, out):
    """EP=2: one step, save, then the response log-probs of the fixed batch."""
    args, trainer = build_trainer(hf, world, ["--save", ckpt] + extra, rank, port)
    trainer.train(0, fixed_rollout_data())
    trainer.save(0)
    _finish(rank, out, _log_probs(trainer))


def _ep_load_worker(rank, world, port, hf, ckpt, extra, out):
    """Start from the checkpoint's weights (--ref-load without --load, or --load --no-load-optim)."""
    args, trainer = build_trainer(hf, world, extra, rank, port)
    start = trainer.load_initial_state()
    ref = _log_probs(trainer, reference=True) if trainer.has_reference else None
    _finish(rank, out, {"start": start, "log_probs": _log_probs(trainer), "ref": ref})


def _log_probs(trainer, reference: bool = False) -> dict:
    data = fixed_rollout_data()
    compute = trainer.compute_reference_log_prob if reference else trainer.compute_log_prob
    got = compute(data, list(range(len(data["tokens"]))))["log_probs"]
    return {str(i): t.tolist() for i, t in got.items()}


def test_ep2_save_loads_with_ep1(tiny_moe_hf, tmp_path):
    """The optimizer's layout (chained per expert group) is the saved one's, so a resharding
    load takes the weights: --ref-load (weights only) or --load --no-load-optim."""
    ckpt = tmp_path / "save"
    want = _run(_ep_save_worker, 2, tmp_path, tiny_moe_hf, ckpt, ["--expert-model-parallel-size", "2"], "ep2")
    runs = ((["--ref-load", str(ckpt), "--use-kl-loss"], 0, True), (["--load", str(ckpt), "--no-load-optim"], 1, False))
    for flags, start, with_ref in runs:
        got = _run(_ep_load_worker, 1, tmp_path, tiny_moe_hf, ckpt, flags, "ep1")
        assert got["start"] == start and (got["ref"] is not None) == with_ref
        assert got["log_probs"].keys() == want.keys()
        for i in want:
            assert got["log_probs"][i] == pytest.approx(want[i], abs=1e-5), f"{flags}: sample {i}"
            if with_ref:  # the reference model takes --ref-load's weights too
                assert got["ref"][i] == pytest.approx(want[i], abs=1e-5), f"{flags}: reference, sample {i}"


def _save_hf_worker(rank, world, port, hf, ckpt, extra, out):
    """One step, save with --save-hf, the response log-probs of the fixed batch."""
    flags = ["--save", ckpt, "--save-hf", str(Path(ckpt) / "hf_{rollout_id}")] + extra
    args, trainer = build_trainer(hf, world, flags, rank, port)
    trainer.train(0, fixed_rollout_data())
    trainer.save(2)
    _finish(rank, out, _log_probs(trainer))


@pytest.mark.parametrize("world,extra", [(1, []), (2, ["--expert-model-parallel-size", "2"])], ids=["ep1", "ep2"])
def test_save_hf_writes_weights_transformers_reads(tiny_moe_hf, tmp_path, world, extra):
    from transformers import AutoModelForCausalLM

    ckpt = tmp_path / "save"
    want = _run(_save_hf_worker, world, tmp_path, tiny_moe_hf, ckpt, extra, "savehf")
    model = AutoModelForCausalLM.from_pretrained(ckpt / "hf_2", dtype=torch.float32).eval()
    data = fixed_rollout_data()
    for i, (tokens, response) in enumerate(zip(data["tokens"], data["response_lengths"])):
        ids = torch.tensor([tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        got = logp.gather(-1, ids[0, 1:, None])[-response:, 0]
        assert got.tolist() == pytest.approx(want[str(i)], abs=1e-4), f"sample {i}"


def test_plain_args_drops_secrets_and_objects():
    import argparse

    from slime.backends.megatron_utils.torch_dist import plain_args

    args = argparse.Namespace(lr=0.1, wandb_key="s3cret", hf_token="t", max_tokens_per_gpu=8,
                              ranks=[1, 2], fn=print, name=None)
    got = vars(plain_args(args, world_size=2))
    assert got == {"lr": 0.1, "max_tokens_per_gpu": 8, "ranks": [1, 2], "name": None, "world_size": 2}


def test_read_tracker(tmp_path):
    from slime.backends.megatron_utils.torch_dist import read_tracker

    assert read_tracker(tmp_path) is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12\n")
    assert read_tracker(tmp_path) == 12
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    assert read_tracker(tmp_path) == "release"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("latest")
    with pytest.raises(ValueError, match="latest_checkpointed_iteration.txt"):
        read_tracker(tmp_path)


# ----- checkpoints written by slime / Megatron-LM ------------------------------------------------
def _barrier_rank0(fn) -> None:
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 0:
        fn()
    dist.barrier()


def _release_worker(rank, world, port, hf, ckpt, extra, out):
    """slime's converter output (weights saved as iteration 1, renamed to `release/`, tracker
    `release`) read by --load and by --ref-load; before that, whether a load's optimizer
    materialisation steps an optimizer that megatron covers itself (TE/Apex)."""
    from megatron.core.optimizer import distrib_optimizer

    from slime.backends.megatron_utils.actor import MegatronTrainer
    from slime.backends.megatron_utils.checkpoint import _materialize_distributed_optimizer_state
    from slime.backends.megatron_utils.torch_dist import save_model

    args, trainer = build_trainer(hf, world, extra, rank, port)
    inner = getattr(trainer.state.optimizer, "chained_optimizers", [trainer.state.optimizer])[0].optimizer
    distrib_optimizer.HAVE_APEX_OR_TE = True  # as on GPU: megatron allocates a fresh optimizer's state itself
    _materialize_distributed_optimizer_state(trainer.state.optimizer)
    with_te = len(inner.state)
    distrib_optimizer.HAVE_APEX_OR_TE = False
    _materialize_distributed_optimizer_state(trainer.state.optimizer)
    without_te = len(inner.state)

    trainer.train(0, fixed_rollout_data())
    want = _log_probs(trainer)
    save_model(trainer.model, args, ckpt, iteration=1)
    _barrier_rank0(lambda: (os.replace(Path(ckpt) / "iter_0000001", Path(ckpt) / "release"),
                            (Path(ckpt) / "latest_checkpointed_iteration.txt").write_text("release")))
    runs = {}
    for flag in ("load", "ref_load"):
        args.load, args.ref_load, args.start_rollout_id = None, None, None
        setattr(args, flag, ckpt)
        fresh = MegatronTrainer(args)
        start = fresh.load_initial_state()
        runs[flag] = {"start": start, "step_id": fresh.step_id, "log_probs": _log_probs(fresh),
                      "next": fresh.train(0, fixed_rollout_data())}
    _finish(rank, out, {"want": want, "runs": runs, "with_te": with_te, "without_te": without_te})


@pytest.fixture(scope="module")
def release(tiny_moe_hf, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("release")
    return _run(_release_worker, 1, tmp, tiny_moe_hf, tmp / "converted", [], "release")


def test_release_checkpoint_loads_weights_only(release):
    """Megatron-LM's release semantics: weights, iteration 0, a fresh optimizer (so --load and
    --ref-load of a converted checkpoint train the same next step)."""
    for flag, got in release["runs"].items():
        assert got["start"] == 0 and got["step_id"] == 0, flag
        for i, want in release["want"].items():
            assert got["log_probs"][i] == pytest.approx(want, abs=1e-5), f"{flag}: sample {i}"
    _assert_same_steps([release["runs"]["load"]["next"]], [release["runs"]["ref_load"]["next"]])


def test_optimizer_materialised_only_where_megatron_does_not(release):
    """With TE/Apex megatron's DistributedOptimizer allocates a fresh optimizer's state on load
    (a `.grad` step would be wrong there: TE's precision-aware FusedAdam reads `decoupled_grad`);
    torch's Adam (no TE/Apex) needs the zero-gradient step."""
    assert release["with_te"] == 0 and release["without_te"] > 0


def _megatron_lm_save(trainer, args, save_dir, iteration: int) -> None:
    """Save as Megatron-LM's training loop before 0.14 (slime's) does with `torch_dist`, the
    distributed optimizer and --no-ckpt-fully-parallel-save: its state-dict keys (no rollout_id),
    the optimizer requested with `sharding_type='dp_zero_gather_scatter'` (chained optimizers
    prefixed), no content metadata, `rng_state` one ShardedObject per (pp, tp) holding [this
    rank's states] stored by data-parallel rank 0, the tracker written after every rank finished.
    (Its default `fully_sharded_model_space` megatron-core 0.16 can neither write nor read: see
    `test_legacy_optimizer_layout_refused`.)"""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as mpu
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from slime.backends.megatron_utils.checkpoint import get_rng_state
    from slime.backends.megatron_utils.model import unwrap
    from slime.backends.megatron_utils.torch_dist import in_process_save_strategy, plain_args

    model_sd = unwrap(trainer.state.model[0]).sharded_state_dict()
    rng = ShardedObject("rng_state", [get_rng_state()],
                        (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size()),
                        (mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank()),
                        replica_id=mpu.get_data_parallel_rank(with_context_parallel=True))
    state = {
        "args": plain_args(args, world_size=dist.get_world_size(), ckpt_fully_parallel_save=False),
        "checkpoint_version": 3.0, "iteration": iteration, "model": model_sd,
        "optimizer": trainer.state.optimizer.sharded_state_dict(model_sd, sharding_type="dp_zero_gather_scatter"),
        "opt_param_scheduler": trainer.state.scheduler.state_dict(), "rng_state": rng,
    }
    folder = Path(save_dir) / f"iter_{iteration:07d}"
    _barrier_rank0(lambda: folder.mkdir(parents=True))
    dist_checkpointing.save(state, str(folder), sharded_strategy=in_process_save_strategy())
    _barrier_rank0(lambda: (Path(save_dir) / "latest_checkpointed_iteration.txt").write_text(str(iteration)))


def _megatron_lm_straight_worker(rank, world, port, hf, ckpt, extra, out):
    """Rollout 0, RNG draws, a save in Megatron-LM's layout, RNG draws, rollouts 1, 2."""
    args, trainer = build_trainer(hf, world, extra, rank, port)
    trainer.train(0, fixed_rollout_data())
    _draws()
    _megatron_lm_save(trainer, args, ckpt, 0)
    draws = _draws()
    _finish(rank, out, {"draws": draws, "next": [trainer.train(i, fixed_rollout_data()) for i in (1, 2)]})


def test_resume_megatron_lm_layout(tiny_moe_hf, tmp_path):
    """EP=2 on 2 ranks (a chained dense + expert distributed optimizer): a checkpoint in
    Megatron-LM's pre-0.14 layout resumes at the next rollout (iteration + 1: slime saves
    iteration = rollout id) with the optimizer layout it was saved in and its RNG states."""
    extra = ["--expert-model-parallel-size", "2"]
    want = _run(_megatron_lm_straight_worker, 2, tmp_path, tiny_moe_hf, tmp_path / "mlm", extra, "mlm")
    got = _run(_resume_worker, 2, tmp_path, tiny_moe_hf, tmp_path / "mlm", extra, "mlm_resume")
    assert got["start"] == 1 and got["draws"] == want["draws"]
    _assert_same_steps(got["next"], want["next"])


def test_legacy_optimizer_layout_refused():
    """A checkpoint without content_metadata is in Megatron-LM's pre-0.14 layout (Megatron-LM's
    loader rule); its `fully_sharded_model_space` optimizer is refused with a way out, its
    `dp_zero_gather_scatter` one (--no-ckpt-fully-parallel-save) and ours are requested as saved."""
    import argparse

    from slime.backends.megatron_utils.checkpoint import (
        CONTENT_METADATA,
        check_optimizer_readable,
        checkpoint_metadata,
    )

    legacy = checkpoint_metadata({"args": argparse.Namespace(ckpt_fully_parallel_save=True)})
    assert legacy == {"distrib_optim_sharding_type": "fully_sharded_model_space"}
    with pytest.raises(ValueError, match="fully_sharded_model_space layout .* --no-load-optim"):
        check_optimizer_readable("ckpt/iter_0000003", legacy)
    no_fps = checkpoint_metadata({"args": argparse.Namespace(ckpt_fully_parallel_save=False)})
    assert no_fps == {"distrib_optim_sharding_type": "dp_zero_gather_scatter"}
    check_optimizer_readable("ckpt", no_fps)
    stored = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}
    assert checkpoint_metadata({"content_metadata": dict(stored), "args": argparse.Namespace()}) == stored
    assert checkpoint_metadata({"content_metadata": dict(CONTENT_METADATA)}) == CONTENT_METADATA
