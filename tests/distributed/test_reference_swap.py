"""The reference model's weights live on the host and are swapped into the actor for the reference
pass (one model on the device, as slime does): the reference log-probs stay the reference's while
the actor trains, and the actor's own weights come back bit for bit after every reference pass."""

import os

import pytest
import torch

from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data
from tests.unit.backends.megatron_utils.spawn_util import spawn

pytestmark = pytest.mark.distributed


def _lp(got) -> list:
    return [got["log_probs"][i].tolist() for i in sorted(got["log_probs"])]


def _worker(rank, world, hf_dir):
    from slime.backends.megatron_utils.parallel import destroy_parallel

    # the reference keeps the freshly initialised weights (the harness loads the HF ones into the actor only)
    _, trainer = build_trainer(hf_dir, world, ["--use-kl-loss", "--kl-loss-coef", "0.5", "--expert-model-parallel-size",
                                               "2"], rank, int(os.environ["MASTER_PORT"]))
    data, mine = fixed_rollout_data(), [0, 1, 2, 3]
    actor_before = _lp(trainer.compute_log_prob(data, mine))
    ref_before = _lp(trainer.compute_reference_log_prob(data, mine))
    out = {"ref_model_freed": trainer.ref_model is None,
           "actor_restored": _lp(trainer.compute_log_prob(data, mine)) == actor_before,
           "ref_differs": ref_before != actor_before}
    metrics = trainer.train(0, fixed_rollout_data())
    out["kl_loss"] = metrics["train/kl_loss"]
    out["ref_kept"] = _lp(trainer.compute_reference_log_prob(data, mine)) == ref_before
    out["actor_trained"] = _lp(trainer.compute_log_prob(data, mine)) != actor_before
    trainer.update_reference_model()  # --ref-update-interval: the reference becomes the actor
    out["ref_refreshed"] = _lp(trainer.compute_reference_log_prob(data, mine)) == _lp(trainer.compute_log_prob(data, mine))
    destroy_parallel()
    return out


def test_reference_pass_swaps_host_weights_into_the_actor(tiny_moe_hf, tmp_path):
    for got in spawn(_worker, 2, tmp_path, hf_dir=str(tiny_moe_hf)):
        assert got["ref_model_freed"] and got["actor_restored"] and got["ref_differs"], got
        assert got["kl_loss"] > 0 and got["ref_kept"] and got["actor_trained"] and got["ref_refreshed"], got
