"""End to end, `train.py --colocate` on CPU (trainer ranks and engines share the bundles): the
toy reward improves, step-0 PPO KL is zero, engine and Megatron log-probs agree, checkpoints are
written; between rollouts the engines report their memory released and the trainer its memory
offloaded; resuming from the checkpoint after rollout 2 reproduces rollouts 3-6; the recorded
rollouts replay into `--debug-train-only` with the same train metrics.

One 6-rollout run (module fixture) serves all the checks.
"""

import shutil
import statistics

import pytest

from tests.e2e.runner import grpo_argv, rollout_rows, run_train

pytestmark = pytest.mark.e2e

NUM_ROLLOUT = 6
TRAIN_KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "train/ppo_kl", "train/kl_loss",
              "train/entropy_loss", "train/pg_clipfrac")


def colocated_argv(e2e_inputs, run_dir, num_rollout, extra=()):
    """The tiny-MoE GRPO flags, colocated: 2 trainer ranks and 2 engines on 2 bundles."""
    argv = grpo_argv(e2e_inputs.hf, e2e_inputs.torch_dist, e2e_inputs.data, run_dir, num_rollout,
                     extra=["--colocate", *extra])
    argv[argv.index("--rollout-num-gpus") + 1] = "2"
    return argv


@pytest.fixture(scope="module")
def colocated_run(e2e_inputs, tmp_path_factory):
    """(run dir, metrics rows) of a 6-rollout colocated run that saves every 2 rollouts,
    evaluates before and after training, and records each rollout's samples."""
    run_dir = tmp_path_factory.mktemp("colocated")
    extra = ["--save-interval", "2", "--eval-interval", "100",
             "--eval-prompt-data", "toy", str(e2e_inputs.data / "eval.jsonl"),
             "--save-debug-rollout-data", str(run_dir / "debug_{rollout_id}.pt")]
    rows = run_train(colocated_argv(e2e_inputs, run_dir, NUM_ROLLOUT, extra), run_dir)
    return run_dir, rows


def test_colocated_run_learns_and_saves(colocated_run):
    run_dir, rows = colocated_run
    by_id = rollout_rows(rows)
    assert sorted(by_id) == list(range(NUM_ROLLOUT))
    rewards = [by_id[i]["rollout/raw_reward"] for i in range(NUM_ROLLOUT)]
    assert statistics.fmean(rewards[-2:]) > statistics.fmean(rewards[:2]), rewards
    assert rows[-1]["eval/toy"] > rows[0]["eval/toy"], (rows[0], rows[-1])
    assert abs(by_id[0]["train/ppo_kl"]) <= 1e-8
    for i in range(NUM_ROLLOUT):
        assert by_id[i]["train/train_rollout_logprob_abs_diff"] < 1e-3, by_id[i]
    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(NUM_ROLLOUT - 1)
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000001", "iter_0000003", "iter_0000005"]
    assert (ckpt / "rollout" / "global_dataset_state_dict_1.pt").is_file()


def test_memory_is_handed_over_between_rollouts(colocated_run):
    """While the trainer trained, both engines reported weights, KV cache and CUDA graphs released
    (holding 0 bytes); after each weight sync the trainer held nothing on its device."""
    _, rows = colocated_run
    by_id = rollout_rows(rows)
    for i in range(NUM_ROLLOUT):
        row = by_id[i]
        for tag in ("weights", "kv_cache", "cuda_graph"):
            assert row[f"perf/engines_{tag}_released_in_train"] == 2, (i, tag, row)
            assert row[f"perf/engines_{tag}_gib_in_train"] == 0, (i, tag, row)
        assert row["perf/train_held_gib_after_offload"] == 0, (i, row)
        assert row["perf/offload_train_weights_gib"] > 0 and row["perf/offload_train_optimizer_gib"] > 0, (i, row)
        assert row["perf/offload_train_time"] > 0 and row["perf/onload_train_time"] > 0, (i, row)


def _stopped_after(ckpt, out, rollout_id):
    """Copy of checkpoint folder `ckpt` as a run stopped after `rollout_id` would have left it."""
    shutil.copytree(ckpt, out)
    for path in [*out.glob("iter_*"), *(out / "rollout").glob("*.pt")]:
        if path.name in (f"iter_{rollout_id:07d}", f"global_dataset_state_dict_{rollout_id}.pt"):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    (out / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
    return out


def test_resume_matches_uninterrupted_run(colocated_run, e2e_inputs, tmp_path):
    """Resume after rollout index 1 with --load (same --num-rollout: the LR schedule's length is
    checkpointed): rollouts 2-5 equal the uninterrupted run's."""
    run_dir, rows = colocated_run
    load = _stopped_after(run_dir / "ckpt", tmp_path / "ckpt", rollout_id=1)
    argv = colocated_argv(e2e_inputs, tmp_path, NUM_ROLLOUT, ["--load", str(load)])
    resumed = rollout_rows(run_train(argv, tmp_path))
    straight = rollout_rows(rows)
    assert sorted(resumed) == list(range(2, NUM_ROLLOUT))
    for i in range(2, NUM_ROLLOUT):
        assert resumed[i]["rollout/raw_reward"] == straight[i]["rollout/raw_reward"], i
        assert resumed[i]["rollout/raw_reward_std"] == straight[i]["rollout/raw_reward_std"], i
        for key in TRAIN_KEYS:
            assert resumed[i][key] == pytest.approx(straight[i][key], abs=1e-6), (i, key)


def test_debug_train_only_replays_recorded_rollout(colocated_run, e2e_inputs, tmp_path):
    """--load-debug-rollout-data trains on the recorded rollout 0 exactly as the recording run did."""
    run_dir, rows = colocated_run
    argv = colocated_argv(e2e_inputs, tmp_path, 1, [
        "--debug-train-only", "--load-debug-rollout-data", str(run_dir / "debug_{rollout_id}.pt")])
    replay = rollout_rows(run_train(argv, tmp_path))
    recorded = rollout_rows(rows)[0]
    assert replay[0]["rollout/raw_reward"] == recorded["rollout/raw_reward"]
    for key in TRAIN_KEYS:
        assert replay[0][key] == pytest.approx(recorded[key], abs=1e-6), key
