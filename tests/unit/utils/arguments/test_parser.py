"""Parser surface: the reference recipe, defaults of slime's flags, types, help text, secrets."""

import json

import pytest

from slime.utils.arguments import (
    DOMAINS,
    SECRET_DESTS,
    ArgumentError,
    build_parser,
    parse_args,
    redacted_vars,
)
from slime.utils.arguments.eval import eval_datasets
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS


def test_reference_recipe_dry_run_parses_with_warnings_only():
    args = parse_args(QWEN3_30B_A3B_ARGS)
    assert args.entry == "train" and args.dry_run
    assert args.moe_layer_freq == [1] * 48
    assert args.add_bias_linear is False and args.num_query_groups == 4
    assert args.global_batch_size == 256 and args.num_steps_per_rollout == 1
    assert args.rollout_num_gpus == 8 and args.offload_train and args.offload_rollout
    assert args.eps_clip_high == 0.28 and args.expert_tensor_parallel_size == 1
    assert args.sglang_dp_size == 8 and args.sglang_enable_dp_attention and args.sglang_mem_fraction_static == 0.7
    assert args.eval_max_response_len == 16384 and args.eval_temperature == 1.0
    assert args.log_probs_max_tokens_per_gpu == 8192
    joined = "\n".join(args.warnings)
    for flag in ("--hf-checkpoint", "--prompt-data", "--eval-prompt-data aime", "--ref-load", "--load"):
        assert flag in joined


def test_reference_recipe_without_dry_run_fails_on_missing_checkpoint():
    argv = [a for a in QWEN3_30B_A3B_ARGS if a != "--dry-run"]
    with pytest.raises(ArgumentError, match="--prompt-data /root/dapo-math-17k/dapo-math-17k.jsonl: no such file"):
        parse_args(argv)


def test_slime_defaults(base_argv):
    args = parse_args(base_argv)
    assert args.update_weight_buffer_size == 512 * 1024**2
    assert args.data_source_path == "slime.rollout.data_source.RolloutDataSourceWithBuffer"
    assert args.rollout_function_path == "slime.rollout.sglang_rollout.generate_rollout"
    assert args.eval_function_path == args.rollout_function_path
    assert args.sglang_server_concurrency == 512 and args.rollout_seed == 42
    assert args.input_key == "input" and args.metadata_key == "metadata" and args.tool_key == "tools"
    assert args.apply_chat_template_kwargs == {} and args.rm_type is None
    assert args.eps_clip_high == args.eps_clip == 0.2 and args.kl_loss_type == "k1"
    assert args.masked_softmax_fusion is True and args.transformer_impl == "transformer_engine"
    assert args.ckpt_format == "torch_dist" and args.seed == 1234 and args.norm_epsilon == 1e-5
    assert args.global_batch_size == 8 and args.num_steps_per_rollout == 1
    assert set(args.warnings) == {
        "--prompt-data not given: the data source must supply prompts itself",
        f"--hf-checkpoint {base_argv[6]} has no config.json: MODEL_ARGS not cross-checked",
    }


@pytest.mark.parametrize("engine", ["sglang", "local", "auto"])
def test_colocate_is_accepted_with_every_engine_and_turns_the_hand_over_on(base_argv, engine):
    args = parse_args(base_argv + ["--rollout-engine", engine])
    assert args.offload_train and args.offload_rollout and args.rollout_num_gpus == 2
    assert not any("--colocate" in w for w in args.warnings)


def test_colocate_refuses_more_rollout_gpus_than_trainer_gpus(base_argv):
    with pytest.raises(ArgumentError, match=r"--colocate with --rollout-num-gpus 4 > the trainer's GPUs .* = 2\)"):
        parse_args(base_argv + ["--rollout-num-gpus", "4"])
    assert parse_args(base_argv + ["--rollout-num-gpus", "2"]).rollout_num_gpus == 2


def test_entry_is_stored_and_checked(base_argv):
    argv = [a for a in base_argv if a != "--colocate"] + ["--rollout-num-gpus", "2"]
    assert parse_args(argv, entry="train_async").entry == "train_async"
    with pytest.raises(ValueError, match="entry"):
        build_parser("train_sync")


def test_unknown_flag_is_an_error_naming_it(base_argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(base_argv + ["--no-such-flag", "1"])
    assert "--no-such-flag" in capsys.readouterr().err


def test_every_flag_has_help_and_one_group_per_domain():
    from slime.utils.arguments import logger as logger_domain

    assert logger_domain.SECRET_DESTS == SECRET_DESTS  # the package attribute is the domain module
    parser = build_parser()
    titles = [g.title for g in parser._action_groups]
    for domain in DOMAINS:
        assert domain.__name__.rsplit(".", 1)[-1] in titles
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and action.help.strip(), action.option_strings


@pytest.mark.parametrize("rm_type", ["deepscaler", "boxed_dapo", "math", "f1", "gpqa", "random", "boxed_f1"])
def test_rm_types_accepted(base_argv, rm_type):
    assert parse_args(base_argv + ["--rm-type", rm_type]).rm_type == rm_type


def test_bad_rm_type_names_flag(base_argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(base_argv + ["--rm-type", "boxed_nope"])
    assert "--rm-type" in capsys.readouterr().err


def test_chat_template_kwargs_json(base_argv, capsys):
    args = parse_args(base_argv + ["--apply-chat-template-kwargs", '{"enable_thinking": false}'])
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(SystemExit):
        parse_args(base_argv + ["--apply-chat-template-kwargs", "[1, 2]"])
    assert "--apply-chat-template-kwargs must be a JSON object" in capsys.readouterr().err


def test_repeatable_hooks_and_eval_pairs(base_argv, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("{}\n")
    b.write_text("{}\n")
    args = parse_args(base_argv + ["--rollout-sample-hook-path", "m.h1", "--rollout-sample-hook-path", "m.h2",
                                   "--eval-prompt-data", "aime", str(a), "gsm", f"{b}@[0:5]"])
    assert args.rollout_sample_hook_path == ["m.h1", "m.h2"]
    assert eval_datasets(args) == [("aime", str(a)), ("gsm", f"{b}@[0:5]")]


def test_secret_dests_redacted(base_argv):
    args = parse_args(base_argv + ["--use-wandb", "--wandb-key", "hunter2"])
    assert "wandb_key" in SECRET_DESTS
    shown = redacted_vars(args)
    assert shown["wandb_key"] == "<redacted>" and "hunter2" not in json.dumps(shown, default=str)
    assert args.wandb_key == "hunter2"


def test_megatron_conventions(base_argv):
    args = parse_args(base_argv + ["--no-masked-softmax-fusion", "--no-rope-fusion", "--no-save-optim",
                                   "--hidden-size", "64", "--num-attention-heads", "4", "--swiglu"])
    assert args.masked_softmax_fusion is False and args.apply_rope_fusion is False
    assert args.gradient_accumulation_fusion is True and args.no_save_optim is True
    assert args.kv_channels == 16 and args.ffn_hidden_size == 128 and args.num_query_groups == 4
