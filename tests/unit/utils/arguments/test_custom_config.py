"""--custom-config-path (slime's): YAML keys override the parsed arguments before validation."""

import pytest

from slime.utils.arguments import ArgumentError, parse_args


def _config(tmp_path, text):
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    return ["--custom-config-path", str(path)]


def test_keys_override_flags_and_extra_keys_reach_plugins(base_argv, tmp_path):
    args = parse_args(base_argv + _config(tmp_path, "rollout_batch_size: 8\nadvantage_estimator: gspo\n"
                                                    "my_plugin: {threshold: 0.5}\n"))
    assert args.rollout_batch_size == 8 and args.advantage_estimator == "gspo"
    assert args.my_plugin == {"threshold": 0.5}
    assert args.global_batch_size == 16  # validated after the override: 8 prompts x 2 samples
    assert parse_args(base_argv + _config(tmp_path, "")).rollout_batch_size == 4


def test_strings_go_through_the_flag_type_and_choices_are_checked(base_argv, tmp_path):
    assert parse_args(base_argv + _config(tmp_path, "lr: '3e-4'\n")).lr == pytest.approx(3e-4)
    with pytest.raises(ArgumentError, match="advantage_estimator must be one of"):
        parse_args(base_argv + _config(tmp_path, "advantage_estimator: nope\n"))
    with pytest.raises(ArgumentError, match="expected a mapping"):
        parse_args(base_argv + _config(tmp_path, "- a\n- b\n"))
    with pytest.raises(ArgumentError, match="cannot read it as YAML"):
        parse_args(base_argv + ["--custom-config-path", str(tmp_path / "missing.yaml")])
