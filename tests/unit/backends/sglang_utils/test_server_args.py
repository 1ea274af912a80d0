"""ServerArgs fields and the launch command of one SGLang engine: the reference recipe, framework
fields winning over the passthrough, flag rendering, multi-node topology and the --dry-run launch
lines (tests/conformance/against_sglang/test_server_args.py parses them with real releases)."""

import argparse
import json

import pytest

from slime.backends.sglang_utils import server_args as sa
from slime.utils.arguments import parse_args
from slime.utils.arguments.sglang import server_arg_fields
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS

FLAGS = {entry["flag"] for entry in server_arg_fields()}


def _qwen_args(*extra):
    return parse_args(QWEN3_30B_A3B_ARGS + list(extra))


def _fields(args, engine_rank=0, **kwargs):
    base = dict(engine_rank=engine_rank, num_engines=args.rollout_num_gpus // args.rollout_num_gpus_per_engine,
                host="10.0.0.5", port=31000, nccl_port=31001, dist_init_addr=None, base_gpu_id=0)
    return sa.sglang_server_args(args, **{**base, **kwargs})


def _flags(argv):
    return [a for a in argv if a.startswith("--")]


def test_qwen3_30b_a3b_recipe_fields():
    args = _qwen_args()
    fields = _fields(args)
    assert fields["tp_size"] == 8 and fields["ep_size"] == 8 and fields["dp_size"] == 8
    assert fields["enable_dp_attention"] is True and fields["mem_fraction_static"] == 0.7
    assert fields["model_path"] == "/root/Qwen3-30B-A3B" and fields["pp_size"] == 1
    assert fields["enable_memory_saver"] is True  # --colocate turns on --offload-rollout
    assert fields["skip_server_warmup"] is True and fields["trust_remote_code"] is True
    assert (fields["host"], fields["port"], fields["nccl_port"]) == ("10.0.0.5", 31000, 31001)
    assert fields["nnodes"] == 1 and fields["node_rank"] == 0 and fields["dist_init_addr"] is None


def test_random_seed_differs_per_engine():
    args = _qwen_args("--seed", "7", "--actor-num-nodes", "2", "--rollout-num-gpus", "16")
    seeds = [_fields(args, engine_rank=rank)["random_seed"] for rank in range(2)]
    assert seeds == [7, 8]


def test_memory_saver_follows_offload_rollout():
    argv = [a for a in QWEN3_30B_A3B_ARGS if a != "--colocate"] + ["--rollout-num-gpus", "8"]
    assert _fields(parse_args(argv))["enable_memory_saver"] is False


def test_framework_fields_win_over_passthrough(caplog):
    args = _qwen_args("--sglang-host", "0.0.0.0", "--sglang-pp-size", "1", "--sglang-log-level", "debug")
    with caplog.at_level("WARNING"):
        fields = _fields(args)
    assert fields["host"] == "10.0.0.5" and fields["log_level"] == "debug"
    assert "--sglang-host" in caplog.text
    argv = sa.server_command(fields)
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "10.0.0.5"


def test_every_emitted_flag_is_a_pinned_field():
    args = _qwen_args("--sglang-cuda-graph-bs", "1", "2", "4", "--sglang-quantization", "fp8",
                      "--sglang-disable-radix-cache", "--sglang-context-length", "32768")
    argv = sa.server_command(_fields(args))
    assert argv[:3] == list(sa.DEFAULT_LAUNCHER)
    for flag in _flags(argv):
        assert flag in FLAGS, flag
    # the pinned 0.5.23 has --cuda-graph-bs-decode where older releases had --cuda-graph-bs
    for flag in ("--cuda-graph-bs-decode", "--quantization", "--disable-radix-cache", "--context-length"):
        assert flag in argv


def test_value_rendering():
    fields = {"model_path": "/m", "tp_size": 2, "enable_dp_attention": True, "disable_radix_cache": False,
              "dist_init_addr": None, "cuda_graph_bs_decode": [1, 2, 8], "mem_fraction_static": 0.5,
              "mm_process_config": {"image": {"max_pixels": 64}, "a": 1}}
    argv = sa.server_command(fields, launcher=("run",))
    assert argv[:5] == ["run", "--model-path", "/m", "--tp-size", "2"]
    i = argv.index("--enable-dp-attention")
    assert argv[i + 1] == "--cuda-graph-bs-decode"  # bare flag; False and None fields are left out
    assert "--disable-radix-cache" not in argv and "--dist-init-addr" not in argv
    assert argv[i + 2:i + 5] == ["1", "2", "8"]
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.5"
    assert json.loads(argv[argv.index("--mm-process-config") + 1]) == fields["mm_process_config"]


def test_options_that_take_json():
    """0.5.23 reads these with a JSON type: one word each."""
    fields = {"remote_instance_weight_loader_send_weights_group_ports": [5000, 5001],
              "forward_hooks": [{"name": "h", "target_modules": ["x"]}]}
    argv = sa.server_command(fields, launcher=())
    assert argv[:2] == ["--remote-instance-weight-loader-send-weights-group-ports", "[5000, 5001]"]
    assert json.loads(argv[3]) == fields["forward_hooks"] and len(argv) == 4


def test_unknown_field_is_refused():
    with pytest.raises(ValueError, match="not options of sglang 0.5.23.*not_a_field"):
        sa.server_command({"model_path": "/m", "not_a_field": 1})


def test_multi_node_engine_gets_topology():
    args = _qwen_args("--rollout-num-gpus-per-engine", "16", "--rollout-num-gpus", "16", "--actor-num-nodes", "2",
                      "--sglang-dp-size", "16", "--sglang-ep-size", "16")
    assert sa.engine_nnodes(args) == 2
    fields = _fields(args, node_rank=1, dist_init_addr="10.0.0.5:5000")
    assert (fields["nnodes"], fields["node_rank"], fields["dist_init_addr"]) == (2, 1, "10.0.0.5:5000")
    assert fields["tp_size"] == 16
    argv = sa.server_command(fields)
    assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.5:5000"
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    with pytest.raises(ValueError, match="dist_init_addr"):
        _fields(args, node_rank=1)
    with pytest.raises(ValueError, match="--num-gpus-per-node"):
        _fields(args, nnodes=1, dist_init_addr="10.0.0.5:5000")
    with pytest.raises(ValueError, match="node_rank 2"):
        _fields(args, node_rank=2, dist_init_addr="10.0.0.5:5000")


def test_engine_nnodes_needs_whole_nodes():
    args = argparse.Namespace(rollout_num_gpus_per_engine=12, num_gpus_per_node=8)
    with pytest.raises(ValueError, match="--rollout-num-gpus-per-engine 12"):
        sa.engine_nnodes(args)


def test_engine_rank_must_be_in_range():
    with pytest.raises(ValueError, match="engine_rank 1"):
        _fields(_qwen_args(), engine_rank=1)


@pytest.mark.parametrize("extra, expected", [
    # colocated, 2 engines x TP4 on node 0
    (["--rollout-num-gpus-per-engine", "4", "--sglang-ep-size", "4", "--sglang-dp-size", "4"],
     [sa.EngineProcess(0, 0, 1, 0, 0), sa.EngineProcess(1, 0, 1, 0, 4)]),
    # disaggregated: rollout GPUs 8..23 after the trainer's 8, one TP16 engine over nodes 1 and 2
    (["--rollout-num-gpus", "16", "--rollout-num-gpus-per-engine", "16", "--sglang-ep-size", "16",
      "--sglang-dp-size", "16"],
     [sa.EngineProcess(0, 0, 2, 1, 0), sa.EngineProcess(0, 1, 2, 2, 0)]),
])
def test_planned_engine_processes(extra, expected):
    argv = list(QWEN3_30B_A3B_ARGS)
    if "--rollout-num-gpus" in extra:
        argv.remove("--colocate")
    assert sa.planned_engine_processes(parse_args(argv + extra)) == expected


def test_dry_run_prints_each_engine_command(capsys):
    import shlex

    import train

    secret = "user-sglang-SECRET-55"  # a key of the user's never shows: the lines carry a placeholder
    assert train.main(QWEN3_30B_A3B_ARGS + ["--rollout-num-gpus-per-engine", "4", "--sglang-ep-size", "4",
                                            "--sglang-dp-size", "4", "--sglang-cuda-graph-bs", "1", "2",
                                            "--sglang-api-key", secret]) == 0
    out = capsys.readouterr().out
    assert secret not in out
    lines = [line for line in out.splitlines() if line.startswith("sglang command: ")]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        argv = shlex.split(line[len("sglang command: "):])
        assert argv[argv.index("--base-gpu-id") + 1] == str(4 * rank)
        assert argv[argv.index("--tp-size") + 1] == "4" and argv[argv.index("--random-seed") + 1] == str(1234 + rank)
        assert argv[argv.index("--cuda-graph-bs-decode") + 1: argv.index("--cuda-graph-bs-decode") + 3] == ["1", "2"]
        assert argv[:3] == list(sa.DEFAULT_LAUNCHER)  # sglang_main: the key by environment
        assert "--api-key" not in argv and "--admin-api-key" not in argv
