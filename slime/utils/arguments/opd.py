"""On-policy distillation domain (slime's `--use-opd` family): the student samples, a teacher
scores the student's response tokens with its log-probs, and the per-token reverse KL
(student - teacher log-prob) scaled by `--opd-kl-coef` is subtracted from the task advantage
(`slime.utils.advantages.apply_opd_advantages`).

Two teachers (`--opd-type`): `sglang`, an SGLang server (or our local engine) at
`--opd-teacher-url` asked for the log-probs of each finished sample on the rollout side
(`slime.rollout.opd_teacher`); `megatron`, a Megatron checkpoint (`--opd-teacher-load`) of the
student's architecture whose log-prob pass runs in the trainer with the store prefix "teacher_".
"""

from __future__ import annotations

import argparse
from urllib.parse import urlparse

from slime.utils.arguments.common import check_load, require

OPD_TYPES = ("sglang", "megatron")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the on-policy distillation flags as one argument group."""
    group = parser.add_argument_group(
        "opd", "On-policy distillation: a teacher's per-token log-probs as a training signal.")
    group.add_argument("--use-opd", action="store_true", default=False,
                       help="On-policy distillation: subtract --opd-kl-coef * (student log-prob - teacher log-prob) "
                       "of every response token from its advantage. Needs --opd-type.")
    group.add_argument("--opd-type", type=str, choices=OPD_TYPES, default=None,
                       help="Where the teacher runs: sglang (an SGLang-compatible server at --opd-teacher-url, asked "
                       "for the log-probs of each finished sample, stored in Sample.teacher_log_probs) or megatron "
                       "(--opd-teacher-load, same architecture as the student, a log-prob pass in the trainer with "
                       "store prefix 'teacher_').")
    group.add_argument("--opd-kl-coef", type=float, default=1.0,
                       help="Weight of the per-token reverse KL (student - teacher log-prob) subtracted from the "
                       "advantages.")
    group.add_argument("--opd-teacher-url", type=str, default=None,
                       help="--opd-type sglang: base URL of the teacher's server (e.g. http://127.0.0.1:13141), "
                       "an SGLang server or `python -m slime.backends.local_engine` serving the teacher checkpoint; "
                       "it gets POST /generate with max_new_tokens 0, return_logprob and logprob_start_len.")
    group.add_argument("--opd-teacher-load", type=str, default=None,
                       help="--opd-type megatron: Megatron torch_dist checkpoint of the teacher (the student's "
                       "architecture and parallel flags); its weights stay on the host and are swapped into the "
                       "actor for the teacher pass, as the reference model's are.")


def validate(args: argparse.Namespace) -> list[str]:
    """--use-opd needs --opd-type; sglang needs an http(s) --opd-teacher-url and no --opd-teacher-load;
    megatron needs a complete --opd-teacher-load checkpoint and no --opd-teacher-url; --opd-kl-coef
    >= 0; the distillation signal lives in the advantages, so not with
    --disable-compute-advantages-and-returns. The teacher flags without --use-opd are an error."""
    warnings: list[str] = []
    if not args.use_opd:
        stray = [flag for flag, value in (("--opd-type", args.opd_type), ("--opd-teacher-url", args.opd_teacher_url),
                                          ("--opd-teacher-load", args.opd_teacher_load)) if value is not None]
        require(not stray, f"{', '.join(stray)} given without --use-opd: add --use-opd or drop them")
        return warnings
    require(args.opd_type is not None,
            "--use-opd needs a teacher: --opd-type sglang --opd-teacher-url URL, or --opd-type megatron "
            "--opd-teacher-load DIR")
    require(args.opd_kl_coef >= 0, f"--opd-kl-coef must be >= 0, got {args.opd_kl_coef}")
    if args.opd_kl_coef == 0:
        warnings.append("--use-opd with --opd-kl-coef 0: the teacher is queried but does not change the advantages")
    require(not args.disable_compute_advantages_and_returns,
            "--use-opd adds the teacher's signal to the advantages, which --disable-compute-advantages-and-returns "
            "skips: drop one of them")
    if args.opd_type == "sglang":
        _validate_sglang_teacher(args)
    else:
        require(args.opd_teacher_load is not None,
                "--opd-type megatron needs --opd-teacher-load (the teacher's torch_dist checkpoint)")
        require(args.opd_teacher_url is None,
                "--opd-teacher-url is for --opd-type sglang; --opd-type megatron loads --opd-teacher-load")
        check_load(args, "--opd-teacher-load", args.opd_teacher_load, None, "", warnings)
    return warnings


def _validate_sglang_teacher(args: argparse.Namespace) -> None:
    require(args.opd_teacher_url is not None,
            "--opd-type sglang needs --opd-teacher-url (the teacher server's base URL, e.g. http://127.0.0.1:13141)")
    url = urlparse(args.opd_teacher_url)
    require(url.scheme in ("http", "https") and bool(url.netloc) and url.path in ("", "/"),
            f"--opd-teacher-url {args.opd_teacher_url!r}: expected a base URL like http://HOST:PORT "
            "(no path: /generate is appended)")
    require(args.opd_teacher_load is None,
            "--opd-teacher-load is for --opd-type megatron; --opd-type sglang asks --opd-teacher-url")
