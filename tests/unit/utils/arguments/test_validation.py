"""Each validation rule: the error names the flags involved; resolutions and warnings."""

import re

import pytest

from slime.utils.arguments import ArgumentError, parse_args

MOE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "8", "--num-experts", "8"]

# (extra argv, flags the ArgumentError message must name)
ERROR_CASES = [
    (["--tensor-model-parallel-size", "4"], ["--tensor-model-parallel-size 4", "--actor-num-gpus-per-node 2"]),
    (["--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"],
     ["--pipeline-model-parallel-size 2", "--context-parallel-size 2"]),
    (["--num-experts", "3", "--expert-model-parallel-size", "2"],
     ["--num-experts 3", "--expert-model-parallel-size 2"]),
    (["--num-attention-heads", "3", "--hidden-size", "48", "--tensor-model-parallel-size", "2",
      "--sequence-parallel"], ["--num-attention-heads 3", "--tensor-model-parallel-size 2"]),
    (["--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "1",
      "--tensor-model-parallel-size", "2"], ["--num-query-groups 1", "--tensor-model-parallel-size 2"]),
    (["--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2"],
     ["--expert-model-parallel-size 2", "--expert-tensor-parallel-size 2"]),
    (["--global-batch-size", "3"], ["--global-batch-size 3", "--rollout-batch-size 4"]),
    (["--num-steps-per-rollout", "3"], ["--num-steps-per-rollout 3", "--n-samples-per-prompt 2"]),
    (["--global-batch-size", "8", "--num-steps-per-rollout", "2"],
     ["--global-batch-size 8", "--num-steps-per-rollout 2"]),
    (["--global-batch-size", "2", "--micro-batch-size", "2"],
     ["--global-batch-size 2", "--micro-batch-size 2", "data-parallel size 2"]),
    (["--num-layers", "4", "--moe-layer-freq", "[1]*3"], ["--moe-layer-freq", "--num-layers 4"]),
    (["--sglang-dp-size", "2", "--rollout-num-gpus-per-engine", "2"],
     ["--sglang-dp-size 2", "--sglang-enable-dp-attention"]),
    (["--rollout-num-gpus-per-engine", "4"], ["--rollout-num-gpus 2", "--rollout-num-gpus-per-engine 4"]),
    (["--use-dynamic-batch-size"], ["--use-dynamic-batch-size", "--max-tokens-per-gpu"]),
    (["--rollout-temperature", "0"], ["--rollout-temperature"]),
    (MOE + ["--tensor-model-parallel-size", "2"],
     ["--tensor-model-parallel-size 2", "--num-experts 8", "--sequence-parallel"]),
    (["--rm-type", "remote_rm"], ["--rm-type remote_rm", "--rm-url"]),
    (["--rm-type", "char_match"], ["--rm-type char_match", "--rollout-skip-special-tokens"]),
    (["--eps-clip-c", "0.5"], ["--eps-clip-c"]),
    (["--loss-type", "custom_loss"], ["--loss-type custom_loss", "--custom-loss-function-path"]),
    (["--debug-rollout-only", "--debug-train-only"], ["--debug-rollout-only", "--debug-train-only"]),
    (["--save-debug-rollout-data", "/tmp/x_{step}.pt"], ["--save-debug-rollout-data", "{rollout_id}"]),
    (["--over-sampling-batch-size", "2"], ["--over-sampling-batch-size 2", "--rollout-batch-size 4"]),
    (["--eval-prompt-data", "aime"], ["--eval-prompt-data"]),
    (["--rollout-num-gpus-per-engine", "2", "--sglang-pp-size", "4"],
     ["--rollout-num-gpus-per-engine 2", "--sglang-pp-size 4"]),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"],
     ["--recompute-method uniform", "--recompute-granularity full"]),
    (["--bf16", "--fp16"], ["--bf16", "--fp16"]),
    (["--context-parallel-size", "2", "--transformer-impl", "local"],
     ["--context-parallel-size 2", "--transformer-impl local"]),
    (["--rollout-max-prompt-len", "64", "--rollout-max-context-len", "64"],
     ["--rollout-max-prompt-len 64", "--rollout-max-context-len 64"]),
    (["--colocate", "--update-weights-interval", "2"], ["--update-weights-interval 2", "--colocate"]),
    (["--ckpt-format", "torch_dcp"], ["--ckpt-format torch_dcp"]),
]


@pytest.mark.parametrize("extra,flags", ERROR_CASES, ids=[" ".join(c[0])[:40] for c in ERROR_CASES])
def test_rule_error_names_flags(base_argv, extra, flags):
    with pytest.raises(ArgumentError) as info:
        parse_args(base_argv + extra)
    for flag in flags:
        assert flag in str(info.value), (flag, str(info.value))


def test_colocate_with_train_async(base_argv):
    with pytest.raises(ArgumentError, match="--colocate.*train_async"):
        parse_args(base_argv, entry="train_async")


def _without(argv, flag, takes_value=True):
    i = argv.index(flag)
    return argv[:i] + argv[i + 1 + int(takes_value):]


def test_rollout_count_and_batch_size_required(base_argv):
    with pytest.raises(ArgumentError, match="--num-rollout or --num-epoch"):
        parse_args(_without(base_argv, "--num-rollout"))
    assert parse_args(_without(base_argv, "--num-rollout") + ["--num-epoch", "2"]).num_epoch == 2
    with pytest.raises(ArgumentError, match="--rollout-batch-size is required"):
        parse_args(_without(base_argv, "--rollout-batch-size"))


def test_rollout_num_gpus_required_when_not_colocated(base_argv):
    argv = _without(base_argv, "--colocate", takes_value=False)
    with pytest.raises(ArgumentError, match="--rollout-num-gpus is required"):
        parse_args(argv)
    args = parse_args(argv + ["--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2"])
    assert args.rollout_num_gpus == 4 and not args.offload_train


def test_global_batch_derivations(base_argv):
    assert parse_args(base_argv + ["--num-steps-per-rollout", "2"]).global_batch_size == 4
    args = parse_args(base_argv + ["--global-batch-size", "4"])
    assert args.num_steps_per_rollout == 2
    args = parse_args(base_argv + ["--global-batch-size", "4", "--num-steps-per-rollout", "2"])
    assert args.global_batch_size == 4
    # With dynamic batch size the micro-batch x DP rule does not apply.
    args = parse_args(base_argv + ["--global-batch-size", "1", "--use-dynamic-batch-size",
                                   "--max-tokens-per-gpu", "64", "--rollout-batch-size", "1",
                                   "--n-samples-per-prompt", "1"])
    assert args.global_batch_size == 1


def test_sequence_parallel_with_tp1_warns_and_disables(base_argv):
    args = parse_args(base_argv + ["--sequence-parallel"])
    assert args.sequence_parallel is False
    assert any("--sequence-parallel" in w for w in args.warnings)


def test_moe_with_tp_and_sp_is_valid(base_argv):
    args = parse_args(base_argv + MOE + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                         "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"])
    assert args.sequence_parallel and args.expert_tensor_parallel_size == 1
    assert args.moe_ffn_hidden_size == args.ffn_hidden_size == 256


def test_missing_files_error_or_warn_with_dry_run(base_argv, tmp_path):
    cases = [
        (["--prompt-data", str(tmp_path / "p.jsonl") + "@[0:10]"], "--prompt-data " + str(tmp_path / "p.jsonl")),
        (["--eval-prompt-data", "aime", str(tmp_path / "e.jsonl")], "--eval-prompt-data aime"),
        (["--ref-load", str(tmp_path / "ref")], "--ref-load"),
        (["--load", str(tmp_path / "ckpt")], "--load"),
        (["--hf-checkpoint", str(tmp_path / "nohf")], "--hf-checkpoint"),
    ]
    for extra, flag in cases:
        with pytest.raises(ArgumentError, match=re.escape(flag) + ".*no such file"):
            parse_args(base_argv + extra)
        args = parse_args(base_argv + extra + ["--dry-run"])
        assert any(w.startswith(flag) and "--dry-run" in w for w in args.warnings), args.warnings


def test_existing_prompt_slice_is_accepted(base_argv, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"input": "hi"}\n')
    assert parse_args(base_argv + ["--prompt-data", f"{data}@[0:1]"]).prompt_data == f"{data}@[0:1]"


def _torch_dist(root):
    """A folder with a tracker naming a complete torch_dist iteration folder (file names only)."""
    (root / "iter_0000000").mkdir(parents=True)
    for name in ("common.pt", ".metadata", "metadata.json"):
        (root / "iter_0000000" / name).write_bytes(b"")
    (root / "latest_checkpointed_iteration.txt").write_text("0")
    return root


def test_first_launch_load_equal_to_save_starts_fresh_with_one_warning(base_argv, tmp_path):
    ref = _torch_dist(tmp_path / "ref")
    run = str(tmp_path / "run") + "/"
    args = parse_args(base_argv + ["--load", run, "--save", run, "--ref-load", str(ref)])
    assert [w for w in args.warnings if w.startswith("--load")] == [
        f"--load {run} is the save folder and holds no checkpoint yet (a first launch): the actor starts "
        "from --ref-load"]


def test_load_is_never_silently_ignored(base_argv, tmp_path):
    ref = _torch_dist(tmp_path / "ref")
    hf = tmp_path / "hf"
    (hf / "config.json").write_text("{}")
    half = tmp_path / "half"  # a save cut short before megatron wrote metadata.json
    (half / "iter_0000005").mkdir(parents=True)
    (half / "latest_checkpointed_iteration.txt").write_text("5")
    cases = [
        (["--load", str(tmp_path / "new"), "--ref-load", str(ref)], "--load .*new: no such file"),
        (["--load", str(hf), "--ref-load", str(ref)], "--load .*hf has no latest_checkpointed_iteration.txt: a Hugging Face"),
        (["--load", str(half), "--save", str(half)], "--load .*half iter_0000005 lacks common.pt"),
        (["--ref-load", str(hf)], "--ref-load .*hf has no latest_checkpointed_iteration.txt"),
    ]
    for extra, want in cases:
        with pytest.raises(ArgumentError, match=want):
            parse_args(base_argv + extra)
    assert parse_args(base_argv + ["--load", str(ref)]).load == str(ref)


def test_load_debug_rollout_data_implies_train_only(base_argv):
    args = parse_args(base_argv + ["--load-debug-rollout-data", "/tmp/r_{rollout_id}.pt"])
    assert args.debug_train_only is True


def test_sglang_dp_attention_valid(base_argv):
    args = parse_args(base_argv + ["--rollout-num-gpus-per-engine", "2", "--sglang-dp-size", "2",
                                   "--sglang-enable-dp-attention"])
    assert args.sglang_dp_size == 2


def test_group_requests_without_effect_warn(base_argv):
    """--rollout-group-requests is off by default; with a custom generate function (every sample
    generated by it) it parses with a warning naming both flags."""
    assert parse_args(base_argv).rollout_group_requests is False
    args = parse_args(base_argv + ["--rollout-group-requests"])
    assert args.rollout_group_requests and not any("--rollout-group-requests" in w for w in args.warnings)
    args = parse_args(base_argv + ["--rollout-group-requests", "--custom-generate-function-path", "m.gen"])
    assert any("--rollout-group-requests has no effect" in w and "--custom-generate-function-path" in w
               for w in args.warnings)
