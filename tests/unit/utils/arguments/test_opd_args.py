"""On-policy distillation flags (`--use-opd` family): each incomplete or contradictory teacher is
refused at parse time with an error naming the flags."""

import pytest

from slime.utils.arguments import ArgumentError, parse_args
from slime.utils.checkpoint_layout import TRACKER_FILE, iteration_dir

URL = "http://127.0.0.1:13141"


def test_sglang_teacher_parses(base_argv):
    args = parse_args(base_argv + ["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", URL,
                                   "--opd-kl-coef", "0.5"])
    assert (args.use_opd, args.opd_type, args.opd_teacher_url, args.opd_kl_coef) == (True, "sglang", URL, 0.5)


def test_defaults_leave_opd_off(base_argv):
    args = parse_args(base_argv)
    assert not args.use_opd and args.opd_type is None and args.opd_kl_coef == 1.0


def test_megatron_teacher_needs_a_complete_checkpoint(base_argv, tmp_path):
    empty = tmp_path / "teacher"
    empty.mkdir()
    with pytest.raises(ArgumentError, match="--opd-teacher-load"):
        parse_args(base_argv + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(empty)])
    ckpt = tmp_path / "ckpt"
    iteration = iteration_dir(ckpt, 3)
    iteration.mkdir(parents=True)
    for name in ("common.pt", ".metadata", "metadata.json", "__0_0.distcp"):
        (iteration / name).write_bytes(b"x")
    (ckpt / TRACKER_FILE).write_text("3")
    args = parse_args(base_argv + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(ckpt)])
    assert args.opd_teacher_load == str(ckpt)


@pytest.mark.parametrize("extra,flags", [
    (["--use-opd"], ["--use-opd", "--opd-type"]),
    (["--use-opd", "--opd-type", "sglang"], ["--opd-type sglang", "--opd-teacher-url"]),
    (["--use-opd", "--opd-type", "megatron"], ["--opd-type megatron", "--opd-teacher-load"]),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", "127.0.0.1:13141"], ["--opd-teacher-url"]),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", URL + "/generate"], ["--opd-teacher-url"]),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", URL, "--opd-teacher-load", "/x"],
     ["--opd-teacher-load", "--opd-type sglang"]),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", URL, "--opd-kl-coef", "-1"], ["--opd-kl-coef"]),
    (["--opd-type", "sglang", "--opd-teacher-url", URL], ["--opd-type", "--opd-teacher-url", "--use-opd"]),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", URL, "--loss-type", "sft_loss",
      "--disable-compute-advantages-and-returns"], ["--use-opd", "--disable-compute-advantages-and-returns"]),
])
def test_incomplete_teachers_name_their_flags(base_argv, extra, flags):
    with pytest.raises(ArgumentError) as info:
        parse_args(base_argv + extra)
    for flag in flags:
        assert flag in str(info.value)


def test_unknown_opd_type_exits_naming_the_choices(base_argv):
    with pytest.raises(SystemExit):
        parse_args(base_argv + ["--use-opd", "--opd-type", "hf"])
