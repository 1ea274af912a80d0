"""Our engine launch lines, parsed by this sglang release's own `prepare_server_args`.

For every GPU recipe under scripts/ (and its DP_ATTN=1 variant, a 24-GPU engine with redundant
experts, and slime's `--sglang-cuda-graph-bs 1 2 4 8 $(seq 16 8 256)`), the recipe's flags are
taken from the script itself (a `PYTHON` that records its argv instead of running train.py), the
launch line of every engine process is built by `dry_run_commands` (what `--dry-run` prints and
what `prepare` builds for the engine actors) and each must parse with the values we intend.

Version notes: `--cuda-graph-bs` became `--cuda-graph-bs-decode` (0.5.15.post1 keeps the old
spelling as a deprecated alias, 0.5.23 finds it ambiguous with `--cuda-graph-bs-prefill`), so on
both the old slime flag must land on `cuda_graph_bs_decode`;
0.5.23's `--enable-dp-attention` is a deprecated spelling that still stores True (its resolution
turns `dp_size` into `attn_dp_size`), so both releases parse the DP-attention pair as given.
"""

import os
import shlex
import stat
import subprocess

import pytest

from slime.backends.sglang_utils.sglang_main import keyed_server_args
from slime.backends.sglang_utils.server_args import (DRY_RUN_API_KEY, DRY_RUN_DIST_PORT, DRY_RUN_NCCL_PORT,
                                                     DRY_RUN_PORT, dry_run_commands)
from slime.utils.arguments import parse_args
from slime.utils.security import API_KEY_ENV

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CUDA_GRAPH_BS = [1, 2, 4, 8, *range(16, 257, 8)]
# A Qwen3-30B-A3B engine over 3 nodes: 128 experts + 16 redundant = 144 = 6 per GPU of EP24, with
# EPLB moving the hot experts (the flags slime's large MoE recipes pass to SGLang).
REDUNDANT_EXPERTS = ["--actor-num-nodes", "3", "--rollout-num-gpus", "24", "--rollout-num-gpus-per-engine", "24",
                     "--sglang-ep-size", "24", "--sglang-ep-num-redundant-experts", "16", "--sglang-enable-eplb",
                     "--global-batch-size", "192", "--rollout-batch-size", "24"]
# (id, script, env, extra flags, expected {field: value} on every engine process)
RECIPES = [
    ("qwen3-0.6B", "run-qwen3-0.6B.sh", {}, [], {"tp_size": 1, "ep_size": 1, "dp_size": 1}),
    ("qwen3-4B", "run-qwen3-4B.sh", {}, [], {"tp_size": 2, "ep_size": 1, "dp_size": 1}),
    ("qwen3-30B-A3B", "run-qwen3-30B-A3B.sh", {}, [], {"tp_size": 8, "ep_size": 8, "mem_fraction_static": 0.7}),
    ("qwen3-30B-A3B-dp-attn", "run-qwen3-30B-A3B.sh", {"DP_ATTN": "1"}, [],
     {"tp_size": 8, "ep_size": 8, "dp_size": 8, "enable_dp_attention": True}),
    ("qwen3-30B-A3B-fp8", "run-qwen3-30B-A3B.sh", {"FP8": "1"}, [], {"tp_size": 8}),
    # R3: the engines capture and return each token's routed experts
    ("qwen3-30B-A3B-r3", "run-qwen3-30B-A3B.sh", {}, ["--use-rollout-routing-replay"],
     {"tp_size": 8, "enable_return_routed_experts": True}),
    ("qwen3-30B-A3B-redundant-experts", "run-qwen3-30B-A3B.sh", {"DP_ATTN": "1"}, REDUNDANT_EXPERTS,
     {"tp_size": 24, "ep_size": 24, "dp_size": 8, "nnodes": 3, "ep_num_redundant_experts": 16,
      "enable_eplb": True}),
    # the DeepSeek-V3 and GLM-4.5 families: engines over several nodes with EP and DP attention
    ("deepseek-v3", "run-deepseek-v3.sh", {}, [],
     {"tp_size": 64, "ep_size": 64, "dp_size": 8, "enable_dp_attention": True, "nnodes": 8}),
    ("kimi-k2", "run-kimi-k2.sh", {}, [], {"tp_size": 64, "ep_size": 64, "dp_size": 8, "nnodes": 8}),
    ("moonlight-16B-A3B", "run-moonlight-16B-A3B.sh", {}, [], {"tp_size": 8, "ep_size": 8, "dp_size": 8}),
    ("glm4.5-355B-A32B", "run-glm4.5-355B-A32B.sh", {}, [], {"tp_size": 32, "ep_size": 32, "dp_size": 8, "nnodes": 4}),
    ("glm4.5-106B-A12B", "run-glm4.5-106B-A12B.sh", {}, [], {"tp_size": 8, "ep_size": 8, "dp_size": 8}),
]


def recipe_argv(tmp_path, script: str, env: dict, extra: list[str]) -> list[str]:
    """The flags `scripts/<script>` hands train.py (with --dry-run), recorded by a fake PYTHON."""
    record = tmp_path / "argv"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", script), "--dry-run", *extra],
                          env={**os.environ, "PYTHON": str(python), "MODEL_DIR": "/models", **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = record.read_text().split("\0")[:-1]
    assert argv[0] in ("train.py", "train_async.py"), argv[:2]
    return argv[1:]


def prepare(words: list[str]):
    """This release's `prepare_server_args(words)`, without the resolution it starts on releases
    whose ServerArgs is a dataclass (0.5.15: `__post_init__` probes the GPU and reads the model);
    0.5.23's `prepare_server_args` leaves resolution to the launcher already."""
    import dataclasses

    from sglang.srt import server_args as module

    if not dataclasses.is_dataclass(module.ServerArgs):
        return module.prepare_server_args(words)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module.ServerArgs, "__post_init__", lambda self: None)
        return module.prepare_server_args(words)


def parsed_launch_lines(argv: list[str]):
    """[(our argv, sglang's ServerArgs)] for every engine process of the recipe."""
    lines = [line for line in dry_run_commands(parse_args(argv)) if line.startswith("sglang command: ")]
    assert lines, "no engine launch line"
    out = []
    for line in lines:
        words = shlex.split(line[len("sglang command: "):])
        assert words[1:3] == ["-m", "slime.backends.sglang_utils.sglang_main"], words[:3]
        # what sglang_main does before run_server: the key from the environment, never argv
        out.append((words[3:], keyed_server_args(words[3:], environ={API_KEY_ENV: DRY_RUN_API_KEY}, prepare=prepare)))
    return out


@pytest.mark.parametrize("name, script, env, extra, expected", RECIPES, ids=[r[0] for r in RECIPES])
def test_recipe_launch_lines_parse(tmp_path, name, script, env, extra, expected, sglang_version):
    argv = recipe_argv(tmp_path, script, env, extra)
    args = parse_args(argv)
    per_engine, per_node = args.rollout_num_gpus_per_engine, args.num_gpus_per_node
    processes = parsed_launch_lines(argv)
    nnodes = expected.get("nnodes", 1)
    assert len(processes) == args.rollout_num_gpus // per_engine * nnodes
    for index, (words, server_args) in enumerate(processes):
        engine, node_rank = divmod(index, nnodes)
        for field, value in expected.items():
            assert getattr(server_args, field) == value, (name, field, words)
        assert server_args.model_path == args.hf_checkpoint
        assert server_args.pp_size == 1 and server_args.node_rank == node_rank
        assert server_args.base_gpu_id == ((engine * per_engine) % per_node if nnodes == 1 else 0)
        assert server_args.enable_memory_saver is True  # the recipes colocate: --offload-rollout
        assert (server_args.port, server_args.nccl_port) == (DRY_RUN_PORT, DRY_RUN_NCCL_PORT)
        assert server_args.random_seed == args.seed + engine
        assert server_args.skip_server_warmup is True and server_args.trust_remote_code is True
        # the job's key guards every endpoint but /health*; no separate admin key
        assert server_args.api_key == DRY_RUN_API_KEY and server_args.admin_api_key is None
        if nnodes > 1:
            head_node = engine * nnodes  # placeholder hosts are node<N>
            assert server_args.dist_init_addr == f"node{head_node}:{DRY_RUN_DIST_PORT}"
            assert server_args.host == f"node{head_node + node_rank}"
        else:
            assert server_args.dist_init_addr is None


@pytest.mark.parametrize("script, env", [("run-qwen3-30B-A3B.sh", {}), ("run-qwen3-4B.sh", {})])
def test_cuda_graph_batch_sizes_reach_the_engine(tmp_path, script, env, sglang_version):
    """slime's `--sglang-cuda-graph-bs 1 2 4 8 $(seq 16 8 256)` (the 30B recipe passes it) must
    reach SGLang as --cuda-graph-bs-decode (the old option is ambiguous on 0.5.23)."""
    argv = recipe_argv(tmp_path, script, env, [])
    if "--sglang-cuda-graph-bs" not in argv:
        argv += ["--sglang-cuda-graph-bs", *map(str, CUDA_GRAPH_BS)]
    for words, server_args in parsed_launch_lines(argv):
        assert "--cuda-graph-bs" not in words
        assert server_args.cuda_graph_bs_decode == CUDA_GRAPH_BS
        assert server_args.cuda_graph_bs_prefill is None


def test_old_cuda_graph_flag_is_ambiguous_on_newer_releases(sglang_version):
    """Why the mapping exists: the old spelling is only an alias on 0.5.15.post1 and fails
    SGLang's own parser on 0.5.23."""
    argv = ["--model-path", "/m", "--cuda-graph-bs", "1", "2"]
    if sglang_version.startswith("0.5.15"):  # still a deprecated alias there
        assert prepare(argv).cuda_graph_bs_decode == [1, 2]
    else:
        with pytest.raises(SystemExit):
            prepare(argv)


def test_passthrough_lists_the_release_under_test(sglang_version):
    """Where sglang imports (GPU nodes, and here), the passthrough and the launch lines follow the
    installed release's own parser, not the pinned table."""
    from slime.utils.arguments.sglang import live_server_arg_fields, server_args_version

    assert server_args_version() == sglang_version
    assert live_server_arg_fields() is not None


def test_sglang_alias_spelling_reaches_the_engine(tmp_path, sglang_version):
    """Every spelling SGLang's parser accepts is a --sglang-* flag (issue 13): slime recipes pass
    --sglang-expert-parallel-size, SGLang's alias of --ep-size, and the engine gets ep_size."""
    argv = recipe_argv(tmp_path, "run-qwen3-30B-A3B.sh", {}, []) + ["--sglang-expert-parallel-size", "4"]
    for words, server_args in parsed_launch_lines(argv):
        assert server_args.ep_size == 4, words


# 0.5.15-era spellings slime's recipes use -> (ServerArgs field, value) under every release
OLD_SPELLINGS = [("--sglang-cuda-graph-max-bs", "256", "cuda_graph_max_bs_decode", 256),
                 ("--sglang-nsa-prefill-backend", "flashmla_sparse", "dsa_prefill_backend", "flashmla_sparse"),
                 ("--sglang-nsa-decode-backend", "flashmla_kv", "dsa_decode_backend", "flashmla_kv"),
                 ("--sglang-mamba-scheduler-strategy", "no_buffer", "mamba_radix_cache_strategy", "no_buffer")]


def test_old_spellings_reach_the_release_under_test(tmp_path, sglang_version):
    """A recipe written with 0.5.15-era option names dry-runs, and its launch lines, spelled for the
    release under test, parse with that release's own parser into the renamed fields."""
    argv = recipe_argv(tmp_path, "run-qwen3-30B-A3B.sh", {}, [])
    for flag, value, _field, _expected in OLD_SPELLINGS:
        argv += [flag, value]
    for words, server_args in parsed_launch_lines(argv):
        for _flag, _value, field, expected in OLD_SPELLINGS:
            assert getattr(server_args, field) == expected, (field, words)


def test_an_option_the_release_lacks_is_one_clear_error(sglang_version):
    """An option of another supported release only: refused at parse time naming it and the release."""
    from slime.utils.arguments.common import ArgumentError
    from slime.utils.arguments.sglang import passthrough_fields, union_server_arg_fields

    others = [e for e in passthrough_fields(union_server_arg_fields())
              if sglang_version not in e["releases"] and e["kind"] in ("int", "str") and not e["choices"]]
    assert others, f"every supported release's options are options of {sglang_version}"
    entry = others[0]
    argv = recipe_base_argv() + ["--sglang-" + entry["name"].replace("_", "-"), "1"]
    with pytest.raises(ArgumentError, match=f"sglang {sglang_version} .* has no --{entry['name'].replace('_', '-')}"):
        parse_args(argv)


def recipe_base_argv() -> list[str]:
    from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS

    return list(QWEN3_30B_A3B_ARGS)
