"""Contract tests: every plugin point, called through slime.utils.plugins with a user function
written to slime's documented signature (tests/unit/utils/plugin_fixtures.py)."""

import asyncio
from types import SimpleNamespace

import pytest
import torch

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils import plugins
from slime.utils.misc import load_function
from slime.utils.types import Sample


def fixture_path(name):
    return f"tests.unit.utils.plugin_fixtures.{name}"


def fixture(name):
    return load_function(fixture_path(name))


@pytest.fixture
def args():
    return SimpleNamespace(calls=[], n_samples_per_prompt=2, reward_key=None, tis_clip=2.0)


def test_plugin_flags_cover_every_documented_plugin_point():
    assert set(plugins.PLUGIN_FLAGS) == {
        "rollout_function_path", "eval_function_path", "custom_generate_function_path",
        "custom_rm_path", "dynamic_sampling_filter_path", "data_source_path", "buffer_filter_path",
        "custom_reward_post_process_path", "custom_convert_samples_to_train_data_path",
        "rollout_data_postprocess_path", "custom_loss_function_path",
        "custom_advantage_function_path", "custom_tis_function_path",
        "custom_model_provider_path", "custom_megatron_init_path",
        "custom_megatron_before_train_step_hook_path", "rollout_sample_hook_path",
        "rollout_sample_filter_path", "rollout_all_samples_process_path", "custom_rollout_log_function_path",
        "custom_eval_rollout_log_function_path",
        "custom_pg_loss_reducer_function_path", "custom_megatron_before_log_prob_hook_path",
        "custom_update_weight_post_write_path",
    }


# --rollout-function-path / --eval-function-path
def test_rollout_fn_bare_list_is_wrapped(args):
    source = object()
    out = plugins.call_rollout_fn(fixture("generate_rollout_bare"), args, 3, source, evaluation=False)
    assert args.calls == [("generate_rollout_bare", 3, source, False)]
    assert isinstance(out, RolloutFnTrainOutput) and out.metrics is None
    assert [[s.index for s in g] for g in out.samples] == [[0, 1], [2, 3]]


def test_rollout_fn_wrapped_output_passes_through(args):
    out = plugins.call_rollout_fn(fixture("generate_rollout_wrapped"), args, 0, None)
    assert out.metrics == {"rollout/x": 1.0} and len(out.samples) == 1


def test_rollout_fn_flat_list_is_grouped_by_n_samples_per_prompt(args):
    out = plugins.call_rollout_fn(fixture("generate_rollout_flat"), args, 0, None)
    assert [[s.index for s in g] for g in out.samples] == [[0, 1], [2, 3]]
    args.n_samples_per_prompt = 3
    with pytest.raises(TypeError, match="--rollout-function-path"):
        plugins.call_rollout_fn(fixture("generate_rollout_flat"), args, 0, None)


def test_eval_fn_bare_dict_is_wrapped(args):
    out = plugins.call_rollout_fn(fixture("generate_eval_bare"), args, 5, "src", evaluation=True)
    assert args.calls == [("generate_eval_bare", 5, "src", True)]
    assert isinstance(out, RolloutFnEvalOutput)
    assert out.data["toy"]["rewards"] == [1.0, 0.0]
    wrapped = plugins.call_rollout_fn(fixture("generate_eval_wrapped"), args, 5, "src", evaluation=True)
    assert wrapped.metrics == {"eval/x": 2.0}


@pytest.mark.parametrize("name", ["generate_rollout_bad", "generate_rollout_bad_groups"])
def test_rollout_fn_bad_return_names_flag_and_function(args, name):
    with pytest.raises(TypeError, match=rf"--rollout-function-path .*{name}"):
        plugins.call_rollout_fn(fixture(name), args, 0, None)


def test_eval_fn_bad_return_names_eval_flag(args):
    with pytest.raises(TypeError, match="--eval-function-path.*got int: 42"):
        plugins.call_rollout_fn(fixture("generate_rollout_bad"), args, 0, None, evaluation=True)


# --custom-generate-function-path
def test_custom_generate_without_evaluation_param(args):
    sample, params = Sample(prompt="q"), {"temperature": 1.0}
    out = asyncio.run(plugins.call_custom_generate(fixture("custom_generate"), args, sample, params, True))
    assert args.calls == [("custom_generate", sample, params)]
    assert out == [sample] and sample.response == "42"


def test_custom_generate_with_evaluation_param_gets_it(args):
    sample = Sample(prompt="q")
    out = asyncio.run(plugins.call_custom_generate(fixture("custom_generate_eval"), args, sample, {}, True))
    assert args.calls[0][3] is True
    assert len(out) == 2 and out[0] is sample


def test_custom_generate_with_only_var_kwargs_gets_no_evaluation(args):
    """slime passes `evaluation=` only when the signature names it; **kwargs alone gets nothing."""
    sample = Sample(prompt="q")
    out = asyncio.run(plugins.call_custom_generate(fixture("custom_generate_kwargs"), args, sample, {}, True))
    assert out == [sample] and args.calls[0][3] == {}


def test_custom_generate_bad_return(args):
    with pytest.raises(TypeError, match="--custom-generate-function-path.*got str"):
        asyncio.run(plugins.call_custom_generate(fixture("custom_generate_bad"), args, Sample(), {}))


# --custom-rm-path
def test_reward_fn_async_and_sync(args):
    sample = Sample(response="7", label="7")
    assert asyncio.run(plugins.call_reward_fn(fixture("custom_rm"), args, sample, False)) == 1.0
    out = asyncio.run(plugins.call_reward_fn(fixture("custom_rm_sync_dict"), args, sample, False))
    assert out == {"score": 1.0, "acc": True}
    assert [c[0] for c in args.calls] == ["custom_rm", "custom_rm_sync_dict"]
    assert args.calls[0][1] is sample


def test_group_reward_fn(args):
    samples = [Sample(response="1", label="1"), Sample(response="2", label="1")]
    out = asyncio.run(plugins.call_reward_fn(fixture("custom_group_rm"), args, samples, True))
    assert out == [1.0, 0.0] and args.calls[0][1] is samples


def test_reward_fn_bad_returns(args):
    with pytest.raises(TypeError, match="--custom-rm-path.*got str"):
        asyncio.run(plugins.call_reward_fn(fixture("custom_rm_bad"), args, Sample(), False))
    with pytest.raises(TypeError, match="--custom-rm-path.*2 rewards"):
        asyncio.run(
            plugins.call_reward_fn(fixture("custom_group_rm_short"), args, [Sample(), Sample()], True)
        )


# --dynamic-sampling-filter-path
def test_dynamic_filter_bool_is_wrapped_and_kwargs_passed(args):
    group = [Sample(), Sample()]
    out = plugins.call_dynamic_filter(fixture("filter_bool"), args, group, rollout_id=4)
    assert out == DynamicFilterOutput(keep=True, reason=None)
    assert args.calls == [("filter_bool", group, {"rollout_id": 4})]


def test_dynamic_filter_output_tensor_keep_is_normalised(args):
    out = plugins.call_dynamic_filter(fixture("filter_output"), args, [Sample()])
    assert out.keep is False and out.reason == "all_same"


def test_dynamic_filter_bad_return(args):
    with pytest.raises(TypeError, match="--dynamic-sampling-filter-path.*'yes'"):
        plugins.call_dynamic_filter(fixture("filter_bad"), args, [Sample()])


# --buffer-filter-path
def test_buffer_filter_returned_groups_are_removed_from_buffer(args):
    buffer = [[Sample(index=i)] for i in range(4)]
    before = list(buffer)
    out = plugins.call_buffer_filter(fixture("buffer_filter_newest"), args, 7, buffer, 2)
    assert args.calls == [("buffer_filter_newest", 7, before, 2)]
    assert out == before[2:] and buffer == before[:2]


def test_buffer_filter_bad_return(args):
    with pytest.raises(TypeError, match="--buffer-filter-path"):
        plugins.call_buffer_filter(fixture("buffer_filter_bad"), args, 0, [[Sample()]], 1)


# --custom-reward-post-process-path
def test_reward_post_process(args):
    samples = [Sample(reward=1.0), Sample(reward=0.0)]
    raw, rewards = plugins.call_reward_post_process(fixture("reward_post_process"), args, samples)
    assert raw == [1.0, 0.0] and rewards == [0.5, -0.5]
    assert args.calls == [("reward_post_process", samples)]
    with pytest.raises(TypeError, match="--custom-reward-post-process-path"):
        plugins.call_reward_post_process(fixture("reward_post_process_bad"), args, samples)


# --custom-convert-samples-to-train-data-path
def test_convert_samples_to_train_data(args):
    samples = [Sample(index=0, tokens=[1, 2, 3], response_length=1, reward=1.0)]
    out = plugins.call_convert_samples_to_train_data(fixture("convert_samples"), args, samples)
    assert out["sample_indices"] == [0] and out["loss_masks"] == [[1]]
    with pytest.raises(KeyError, match=r"convert_samples_missing.*\['loss_masks'\]"):
        plugins.call_convert_samples_to_train_data(fixture("convert_samples_missing"), args, samples)


# --rollout-data-postprocess-path
def test_rollout_data_postprocess_mutates(args):
    data = {"rewards": [1.0]}
    assert plugins.call_rollout_data_postprocess(fixture("rollout_data_postprocess"), args, 9, data) is None
    assert data["postprocessed_at"] == 9 and args.calls == [("rollout_data_postprocess", 9)]
    with pytest.raises(TypeError, match="--rollout-data-postprocess-path"):
        plugins.call_rollout_data_postprocess(fixture("rollout_data_postprocess_bad"), args, 9, data)


# --custom-loss-function-path
def test_custom_loss(args):
    logits = torch.ones(2, 3)
    batch = {"tokens": [1]}
    loss, log = plugins.call_custom_loss(fixture("custom_loss"), args, batch, logits, torch.mean)
    assert loss.item() == pytest.approx(3.0) and log["train/custom"].item() == pytest.approx(3.0)
    assert args.calls[0][1] is batch and args.calls[0][2] is logits
    with pytest.raises(TypeError, match="--custom-loss-function-path.*got float"):
        plugins.call_custom_loss(fixture("custom_loss_bad"), args, batch, logits, torch.mean)


# --custom-advantage-function-path
def test_custom_advantage(args):
    data = {"rewards": [1.0, -1.0]}
    plugins.call_custom_advantage(fixture("custom_advantage"), args, data)
    assert [a.item() for a in data["advantages"]] == [1.0, -1.0] and "returns" in data
    with pytest.raises(KeyError, match=r"custom_advantage_missing.*\['returns'\]"):
        plugins.call_custom_advantage(fixture("custom_advantage_missing"), args, {"rewards": [1.0]})


# --custom-tis-function-path
def test_custom_tis(args):
    pg_loss = torch.ones(3)
    train, rollout, masks = torch.log(torch.tensor([1.0, 2.0, 4.0])), torch.zeros(3), torch.ones(3)
    loss, out_masks, metrics = plugins.call_custom_tis(
        fixture("custom_tis"), args, pg_loss=pg_loss, train_log_probs=train,
        rollout_log_probs=rollout, loss_masks=masks, extra=1,
    )
    assert torch.allclose(loss, torch.tensor([1.0, 2.0, 2.0])) and out_masks is masks
    assert args.calls[0][5] == {"extra": 1} and "train/tis_mean" in metrics
    with pytest.raises(TypeError, match="--custom-tis-function-path"):
        plugins.call_custom_tis(
            fixture("custom_tis_bad"), args, pg_loss=pg_loss, train_log_probs=train,
            rollout_log_probs=rollout, loss_masks=masks,
        )


def test_custom_tis_slime_style_gets_args_by_keyword_through_loss_options(args):
    from slime.utils.losses import loss_options_from_args

    flags = dict(advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None,
                 use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1", entropy_coef=0.0, use_tis=True,
                 tis_clip=2.0, tis_clip_low=0.0, calculate_per_token_loss=False,
                 custom_tis_function_path=fixture_path("custom_tis_kwonly"))
    vars(args).update(flags)
    tis = loss_options_from_args("policy_loss", args)["tis_function"]
    loss, _, _ = tis(pg_loss=torch.ones(2), train_log_probs=[torch.zeros(2)], rollout_log_probs=[torch.zeros(2)],
                     loss_masks=[torch.ones(2)], total_lengths=[3], response_lengths=[2])
    assert loss.tolist() == [2.0, 2.0] and args.calls == [("custom_tis_kwonly", [3], [2])]


# --custom-model-provider-path
def test_model_provider_vp_stage_only_when_accepted():
    assert plugins.call_model_provider(fixture("model_provider"), True, False, vp_stage=1).provided_with == (
        True, False, 1,
    )
    assert plugins.call_model_provider(fixture("model_provider_old"), True, False, vp_stage=1).provided_with == (
        True, False,
    )
    with pytest.raises(TypeError, match="--custom-model-provider-path.*NoneType"):
        plugins.call_model_provider(fixture("model_provider_bad"), True, True)


# --custom-megatron-init-path / --custom-megatron-before-train-step-hook-path
def test_megatron_init_and_before_train_step_hook(args):
    plugins.call_megatron_init(fixture("megatron_init"), args)
    model, opt, sched = object(), object(), object()
    plugins.call_before_train_step_hook(fixture("before_train_step_hook"), args, 2, 5, model, opt, sched)
    assert args.calls == [("megatron_init",), ("before_train_step_hook", 2, 5, model, opt, sched)]
    with pytest.raises(TypeError, match="--custom-megatron-init-path"):
        plugins.call_megatron_init(fixture("megatron_init_bad"), args)


# --rollout-sample-hook-path
def test_sample_hooks_sync_none_and_async_replacement(args):
    sample = Sample(prompt="q")
    same = asyncio.run(plugins.call_sample_hook(fixture("sample_hook"), args, sample, rollout_id=3, evaluation=True))
    assert same is sample and sample.metadata == {"hooked": True}
    assert args.calls == [("sample_hook", sample, 3, True)]
    new = asyncio.run(plugins.call_sample_hook(fixture("sample_hook_async"), args, sample, rollout_id=3))
    assert new is not sample and new.response == "replaced"
    with pytest.raises(TypeError, match="--rollout-sample-hook-path.*got int"):
        asyncio.run(plugins.call_sample_hook(fixture("sample_hook_bad"), args, sample))


def test_slime_apply_rollout_sample_hooks_passes_only_declared_keywords(args):
    from slime.rollout.sample_hooks import apply_rollout_sample_hooks, set_current_rollout_id

    args.rollout_sample_hook_path = [fixture_path("sample_hook_plain"), fixture_path("sample_hook_kwargs")]
    set_current_rollout_id(7)
    groups = [[Sample(prompt="a")], [Sample(prompt="b"), Sample(prompt="c")]]
    out = asyncio.run(apply_rollout_sample_hooks(args, groups, evaluation=True))
    assert [[s.prompt for s in g] for g in out] == [["a"], ["b", "c"]]
    assert args.calls[0] == ("sample_hook_plain", "a")
    assert args.calls[1] == ("sample_hook_kwargs", {"rollout_id": 7, "evaluation": True})
    with pytest.raises(TypeError):
        asyncio.run(apply_rollout_sample_hooks(args, {"not": "a sample"}))
    args.rollout_sample_hook_path = []
    assert asyncio.run(apply_rollout_sample_hooks(args, "anything")) == "anything"


# --data-source-path
def test_data_source_class(args):
    args.prompts = ["a", "b", "c"]
    source = plugins.make_data_source(fixture("ListDataSource"), args)
    assert len(source) == 3 and [g[0].prompt for g in source.get_samples(2)] == ["a", "b"]
    with pytest.raises(TypeError, match=r"--data-source-path.*BrokenDataSource.*'add_samples'"):
        plugins.make_data_source(fixture("BrokenDataSource"), args)
