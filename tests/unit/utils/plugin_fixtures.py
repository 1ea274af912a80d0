"""User plugin functions written exactly to slime's documented signatures (slime-compat.md §3).

tests/unit/utils/test_plugins.py loads them with `load_function("tests.unit.utils.plugin_fixtures.X")`
and calls them through `slime.utils.plugins`. Each records its call on `args.calls` (a list the
test puts on its args namespace), so no state lives in this module. The `*_bad` ones break their
contract on purpose.
"""

import copy

import torch

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample


def _group(n, start=0):
    return [Sample(index=start + i, group_index=start // max(n, 1), prompt=f"p{start}") for i in range(n)]


# --rollout-function-path / --eval-function-path
def generate_rollout_bare(args, rollout_id, data_source, evaluation=False):
    args.calls.append(("generate_rollout_bare", rollout_id, data_source, evaluation))
    return [_group(2, 0), _group(2, 2)]


def generate_rollout_wrapped(args, rollout_id, data_source, evaluation=False):
    args.calls.append(("generate_rollout_wrapped", rollout_id, data_source, evaluation))
    return RolloutFnTrainOutput(samples=[_group(2, 0)], metrics={"rollout/x": 1.0})


def generate_rollout_flat(args, rollout_id, data_source, evaluation=False):
    args.calls.append(("generate_rollout_flat", rollout_id, data_source, evaluation))
    return _group(2, 0) + _group(2, 2)


def generate_eval_bare(args, rollout_id, data_source, evaluation=False):
    args.calls.append(("generate_eval_bare", rollout_id, data_source, evaluation))
    return {"toy": {"rewards": [1.0, 0.0], "truncated": [False, True], "samples": _group(2)}}


def generate_eval_wrapped(args, rollout_id, data_source, evaluation=False):
    args.calls.append(("generate_eval_wrapped", rollout_id, data_source, evaluation))
    return RolloutFnEvalOutput(data={"toy": {"rewards": [1.0]}}, metrics={"eval/x": 2.0})


def generate_rollout_bad(args, rollout_id, data_source, evaluation=False):
    return 42


def generate_rollout_bad_groups(args, rollout_id, data_source, evaluation=False):
    return [["not a sample"]]


# --custom-generate-function-path
async def custom_generate(args, sample, sampling_params):
    args.calls.append(("custom_generate", sample, sampling_params))
    sample.response = "42"
    sample.status = Sample.Status.COMPLETED
    return sample


async def custom_generate_eval(args, sample, sampling_params, evaluation=False):
    args.calls.append(("custom_generate_eval", sample, sampling_params, evaluation))
    return [sample, copy.deepcopy(sample)]


async def custom_generate_kwargs(args, sample, sampling_params, **kwargs):
    args.calls.append(("custom_generate_kwargs", sample, sampling_params, kwargs))
    return sample


async def custom_generate_bad(args, sample, sampling_params):
    return "42"


# --custom-rm-path
async def custom_rm(args, sample):
    args.calls.append(("custom_rm", sample))
    return float(sample.response == sample.label)


def custom_rm_sync_dict(args, sample):
    args.calls.append(("custom_rm_sync_dict", sample))
    return {"score": 1.0, "acc": True}


async def custom_group_rm(args, samples):
    args.calls.append(("custom_group_rm", samples))
    return [float(s.response == s.label) for s in samples]


async def custom_group_rm_short(args, samples):
    return [1.0]


async def custom_rm_bad(args, sample):
    return "good"


# --dynamic-sampling-filter-path
def filter_bool(args, samples, **kwargs):
    args.calls.append(("filter_bool", samples, kwargs))
    return len(samples) > 1


def filter_output(args, samples, **kwargs):
    args.calls.append(("filter_output", samples, kwargs))
    return DynamicFilterOutput(keep=torch.tensor(False), reason="all_same")


def filter_bad(args, samples, **kwargs):
    return "yes"


# --buffer-filter-path
def buffer_filter_newest(args, rollout_id, buffer, num_samples):
    args.calls.append(("buffer_filter_newest", rollout_id, list(buffer), num_samples))
    return buffer[-num_samples:]  # leaves removal to the caller


def buffer_filter_bad(args, rollout_id, buffer, num_samples):
    return buffer[0]  # a group, not a list of groups


# --custom-reward-post-process-path
def reward_post_process(args, samples):
    args.calls.append(("reward_post_process", samples))
    raw = [s.get_reward_value(args) for s in samples]
    mean = sum(raw) / len(raw)
    return raw, [r - mean for r in raw]


def reward_post_process_bad(args, samples):
    return [0.0] * len(samples)


# --custom-convert-samples-to-train-data-path
def convert_samples(args, samples):
    args.calls.append(("convert_samples", samples))
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [s.reward for s in samples],
        "raw_reward": [s.reward for s in samples],
        "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
        "sample_indices": [s.index for s in samples],
        "loss_masks": [[1] * s.response_length for s in samples],
    }


def convert_samples_missing(args, samples):
    data = convert_samples(args, samples)
    del data["loss_masks"]
    return data


# --rollout-data-postprocess-path
def rollout_data_postprocess(args, rollout_id, rollout_data):
    args.calls.append(("rollout_data_postprocess", rollout_id))
    rollout_data["postprocessed_at"] = rollout_id


def rollout_data_postprocess_bad(args, rollout_id, rollout_data):
    return {"new": "dict"}


# --custom-loss-function-path
def custom_loss(args, batch, logits, sum_of_sample_mean):
    args.calls.append(("custom_loss", batch, logits))
    loss = sum_of_sample_mean(logits.pow(2).sum(-1))
    return loss, {"train/custom": loss.detach()}


def custom_loss_bad(args, batch, logits, sum_of_sample_mean):
    return 1.0


# --custom-advantage-function-path
def custom_advantage(args, rollout_data):
    args.calls.append(("custom_advantage", rollout_data))
    rollout_data["advantages"] = [torch.tensor(r) for r in rollout_data["rewards"]]
    rollout_data["returns"] = rollout_data["advantages"]


def custom_advantage_missing(args, rollout_data):
    rollout_data["advantages"] = list(rollout_data["rewards"])


# --custom-tis-function-path
def custom_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    args.calls.append(("custom_tis", pg_loss, train_log_probs, rollout_log_probs, loss_masks, kwargs))
    weights = torch.exp(train_log_probs - rollout_log_probs).clamp(max=args.tis_clip)
    return pg_loss * weights, loss_masks, {"train/tis_mean": weights.mean()}


def custom_tis_bad(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    return pg_loss


# --custom-model-provider-path
def model_provider(pre_process, post_process, vp_stage=None):
    model = torch.nn.Linear(2, 2)
    model.provided_with = (pre_process, post_process, vp_stage)
    return model


def model_provider_old(pre_process, post_process):
    model = torch.nn.Linear(2, 2)
    model.provided_with = (pre_process, post_process)
    return model


def model_provider_bad(pre_process, post_process, vp_stage=None):
    return None


# --custom-megatron-init-path
def megatron_init(args):
    args.calls.append(("megatron_init",))


def megatron_init_bad(args):
    return "done"


# --custom-megatron-before-train-step-hook-path
def before_train_step_hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    args.calls.append(("before_train_step_hook", rollout_id, step_id, model, optimizer, opt_param_scheduler))


# --rollout-sample-hook-path
def sample_hook(args, sample, *, rollout_id=None, evaluation=False):
    args.calls.append(("sample_hook", sample, rollout_id, evaluation))
    sample.metadata["hooked"] = True


async def sample_hook_async(args, sample, *, rollout_id=None, evaluation=False):
    args.calls.append(("sample_hook_async", sample, rollout_id, evaluation))
    return Sample(prompt=sample.prompt, response="replaced")


def sample_hook_bad(args, sample, *, rollout_id=None, evaluation=False):
    return 1


def sample_hook_plain(args, sample):
    args.calls.append(("sample_hook_plain", sample.prompt))


def sample_hook_kwargs(args, sample, **kwargs):
    args.calls.append(("sample_hook_kwargs", kwargs))


# --custom-tis-function-path in slime's style: everything by keyword
def custom_tis_kwonly(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                      response_lengths):
    args.calls.append(("custom_tis_kwonly", total_lengths, response_lengths))
    return pg_loss * 2, loss_masks, {}


# --data-source-path
class ListDataSource:
    """A minimal user data source: the prompts of `args.prompts`, one per group."""

    def __init__(self, args):
        self.args = args
        self.position = 0

    def get_samples(self, num):
        out = [[Sample(prompt=p)] for p in self.args.prompts[self.position : self.position + num]]
        self.position += num
        return out

    def add_samples(self, groups):
        pass

    def save(self, rollout_id):
        pass

    def load(self, rollout_id=None):
        pass

    def __len__(self):
        return len(self.args.prompts)


class BrokenDataSource:
    def __init__(self, args):
        self.args = args

    def get_samples(self, num):
        return []
