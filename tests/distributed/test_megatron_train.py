"""One training step of the Megatron trainer on gloo: parallel layouts agree with one rank, a GRPO
step moves log-probs the way the advantages say, the first step's ppo_kl is zero, and SFT steps
lower the NLL."""

import pytest

from tests.distributed.megatron_harness import logprob_shift, train_metrics

pytestmark = pytest.mark.distributed

REL = 1e-5


@pytest.fixture(scope="module")
def single_rank(tiny_moe_hf, tiny_dense_hf, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("base")
    return {
        "moe": train_metrics(tiny_moe_hf, 1, [], tmp, tag="moe")[0],
        "dense": train_metrics(tiny_dense_hf, 1, [], tmp, tag="dense")[0],
    }


LAYOUTS = {
    "dp2-moe": ("moe", []),
    "ep2-moe": ("moe", ["--expert-model-parallel-size", "2"]),
    # micro-batches of at most 12 tokens: the ranks must agree on how many micro-batches they run
    "ep2-moe-dynamic": ("moe", ["--expert-model-parallel-size", "2", "--use-dynamic-batch-size",
                                "--max-tokens-per-gpu", "12"]),
    "pp2-moe": ("moe", ["--pipeline-model-parallel-size", "2"]),
    "tp2-dense": ("dense", ["--tensor-model-parallel-size", "2"]),
    "tp2-sp-moe": ("moe", ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_two_rank_layout_matches_one_rank(name, single_rank, tiny_moe_hf, tiny_dense_hf, tmp_path):
    model, extra = LAYOUTS[name]
    hf = tiny_moe_hf if model == "moe" else tiny_dense_hf
    got = train_metrics(hf, 2, extra, tmp_path)[0]
    want = single_rank[model]
    for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/entropy_loss"):
        assert got[key] == pytest.approx(want[key], rel=REL), f"{name}: {key} {got[key]} vs one rank {want[key]}"


def test_grpo_step_moves_log_probs_with_advantages(tiny_moe_hf, tmp_path):
    result = logprob_shift(tiny_moe_hf, tmp_path)
    assert abs(result["metrics"]["train/ppo_kl"]) <= 1e-8
    for reward, shift in zip(result["rewards"], result["shift"]):
        assert (shift > 0) == (reward > 0), f"reward {reward} but log-prob moved by {shift}"


def test_sft_steps_lower_the_masked_nll(tiny_dense_hf, tmp_path):
    """slime's SFT path: --loss-type sft_loss with --disable-compute-advantages-and-returns trains
    on the masked tokens' NLL (no advantages, no old-policy pass, no policy-loss metrics)."""
    sft = ["--loss-type", "sft_loss", "--disable-compute-advantages-and-returns", "--calculate-per-token-loss",
           "--data-pad-size-multiplier", "4"]  # rows padded to multiples of 4: a separate segment
    metrics = train_metrics(tiny_dense_hf, 1, sft, tmp_path, rollouts=2, tag="sft")
    losses = [m["train/loss"] for m in metrics]
    assert losses[0] > losses[1] > 0, losses
    assert not any(key.startswith("train/pg_") or key == "train/ppo_kl" for key in metrics[0])


def test_per_token_loss_gradients_do_not_grow_with_data_parallel(tiny_dense_hf, tmp_path):
    """gpu-first-contact trainer item 5: with --calculate-per-token-loss megatron sums gradients over
    DP and divides by the global token count the loss function reports; two data-parallel ranks
    give one rank's loss and gradient norm (not twice it)."""
    per_token = ["--calculate-per-token-loss"]
    one = train_metrics(tiny_dense_hf, 1, per_token, tmp_path, tag="one")[0]
    two = train_metrics(tiny_dense_hf, 2, per_token, tmp_path, tag="two")[0]
    for key in ("train/loss", "train/grad_norm", "train/pg_loss"):
        assert two[key] == pytest.approx(one[key], rel=REL), f"{key}: dp2 {two[key]} vs one rank {one[key]}"
