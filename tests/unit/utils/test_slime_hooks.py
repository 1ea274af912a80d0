"""The three trainer/weight-sync plugin hooks with slime's signatures and call sites:
--custom-pg-loss-reducer-function-path (policy_loss's pg_loss only),
--custom-megatron-before-log-prob-hook-path (MegatronTrainer._fill_log_probs, per pass) and
--custom-update-weight-post-write-path (UpdateWeightFromDisk, after the folder is written)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slime.backends.megatron_utils.update_weight import _post_write_hook
from slime.backends.megatron_utils.update_weight.from_disk import UpdateWeightFromDisk
from slime.utils import losses

HERE = "tests.unit.utils.test_slime_hooks"
CALLS: list = []  # what the plugin functions below saw (cleared by each test)


def last_token_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """A slime-style factory: the reducer sums each sample's last masked token."""
    CALLS.append(("factory", list(total_lengths), list(response_lengths), len(loss_masks), calculate_per_token_loss))
    ends = torch.tensor(response_lengths).cumsum(0) - 1
    return lambda x: x[ends].sum()


def bad_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    return lambda x: x  # not a scalar


def before_log_prob(args, model, store_prefix):
    CALLS.append(("log_prob", store_prefix, model))


def post_write(args, version_dir, rollout_engines):
    index = json.loads((Path(version_dir) / "model.safetensors.index.json").read_text())
    CALLS.append(("post_write", args.tag, sorted(index["weight_map"]), list(rollout_engines)))


@pytest.fixture(autouse=True)
def _clear():
    CALLS.clear()


def _policy_args(reducer: str | None):
    return SimpleNamespace(
        advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=None, eps_clip_c=None, use_kl_loss=False,
        kl_loss_coef=0.0, kl_loss_type="k1", entropy_coef=0.0, use_tis=False, tis_clip=2.0, tis_clip_low=0.0,
        calculate_per_token_loss=False, custom_tis_function_path=None, custom_pg_loss_reducer_function_path=reducer)


def _policy_loss(args):
    old = torch.tensor([-1.0, -2.0, -0.5])
    adv = torch.tensor([1.0, 2.0, 3.0])
    return losses.policy_loss(log_probs=old.clone(), old_log_probs=old, advantages=adv,
                              loss_masks=[torch.ones(2), torch.ones(1)], response_lengths=[2, 1],
                              total_lengths=[5, 4], **losses.loss_options_from_args("policy_loss", args))


def test_pg_loss_reducer_factory_reduces_the_pg_loss_only():
    loss, metrics = _policy_loss(_policy_args(f"{HERE}.last_token_reducer"))
    # ratio 1: per-token pg loss is -advantage; the last tokens of the samples are -2 and -3
    assert float(metrics["pg_loss"]) == pytest.approx(-5.0) and float(loss) == pytest.approx(-5.0)
    assert CALLS == [("factory", [5, 4], [2, 1], 2, False)]
    _, default = _policy_loss(_policy_args(None))
    assert float(default["pg_loss"]) == pytest.approx(-(1 + 2) / 2 - 3)
    assert float(metrics["ppo_kl"]) == float(default["ppo_kl"])  # the other metrics keep the default reducer


def test_pg_loss_reducer_returning_a_non_scalar_names_the_flag():
    with pytest.raises(TypeError, match="--custom-pg-loss-reducer-function-path"):
        _policy_loss(_policy_args(f"{HERE}.bad_reducer"))


class RecordedReference:
    """A HostReference that records when its weights are in the actor."""

    @contextlib.contextmanager
    def swapped_into(self, module):
        CALLS.append(("swap in", module))
        yield
        CALLS.append(("swap out",))


def _trainer(*, ref: bool, disable=False, rollout_logprobs=False):
    from slime.backends.megatron_utils.actor import MegatronTrainer
    from slime.utils.misc import load_function

    trainer = MegatronTrainer.__new__(MegatronTrainer)  # no megatron: the passes are recorded
    trainer.args = SimpleNamespace(disable_compute_advantages_and_returns=disable, use_rollout_logprobs=rollout_logprobs,
                                   use_rollout_routing_replay=False, use_routing_replay=False)
    trainer.state = SimpleNamespace(model=["actor-chunk"])
    trainer.ref_model = None
    trainer._host_reference = RecordedReference() if ref else None
    trainer._log_prob_hook = load_function(f"{HERE}.before_log_prob")
    trainer.log_prob_micro_batches = lambda *a, **k: []

    def compute_log_prob(rollout_data, indices, model=None, **_):
        CALLS.append(("pass", model))
        return None
    trainer.compute_log_prob = compute_log_prob
    return trainer


def test_before_log_prob_hook_runs_before_each_pass():
    data = {"tokens": [[1, 2]], "rollout_log_probs": [[0.0]]}
    _trainer(ref=True)._fill_log_probs(data, [0])
    assert CALLS == [("log_prob", "", ["actor-chunk"]), ("pass", None),  # the reference pass runs the actor
                     ("swap in", "actor-chunk"), ("log_prob", "ref_", ["actor-chunk"]), ("pass", None), ("swap out",)]
    CALLS.clear()
    _trainer(ref=False, rollout_logprobs=True)._fill_log_probs(data, [0])
    assert CALLS == []  # no pass, no hook (slime calls it from compute_log_prob)


def _disk_sender(tmp_path, args):
    bucket = [("model.norm.weight", torch.ones(4))]
    sender = UpdateWeightFromDisk(["http://e0:1", "http://e1:2"], lambda: iter([bucket]), tmp_path / "w",
                                  tmp_path, post_write=_post_write_hook(args))
    sender.on_engines = lambda call: CALLS.append(("engines",))  # no engines: record the calls
    return sender


def test_post_write_hook_sees_the_written_folder_before_the_engines_load_it(tmp_path):
    args = SimpleNamespace(custom_update_weight_post_write_path=f"{HERE}.post_write", tag="job")
    _disk_sender(tmp_path, args).update_weights("3")
    hook = CALLS.index(("post_write", "job", ["model.norm.weight"], ["http://e0:1", "http://e1:2"]))
    assert [c[0] for c in CALLS[hook + 1:]] == ["engines", "engines"]  # load, then continue generation
    assert _post_write_hook(SimpleNamespace(custom_update_weight_post_write_path=None)) is None


def test_post_write_hook_must_return_none(tmp_path):
    from slime.utils.plugins import call_update_weight_post_write

    with pytest.raises(TypeError, match="--custom-update-weight-post-write-path"):
        call_update_weight_post_write(lambda *a: "x", None, str(tmp_path), [])
