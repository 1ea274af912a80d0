"""The SGLang process's environment and the memory-saver fields: the CUDA graphs live in the memory
saver (so releasing the `cuda_graph` tag frees them) with the breakable prefill graph, which refuses
the memory saver, disabled; the strict idle memory check and the TP memory-imbalance check off; the
job's PYTORCH_CUDA_ALLOC_CONF not passed on."""

from slime.backends.sglang_utils import server_args as sa
from slime.backends.sglang_utils.engine import SGLangEngine
from slime.utils.arguments import parse_args
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS


def _fields(*extra):
    args = parse_args(QWEN3_30B_A3B_ARGS + list(extra))
    return sa.sglang_server_args(args, engine_rank=0, num_engines=1, host="h", port=1, nccl_port=2,
                                 dist_init_addr=None, base_gpu_id=0)


def test_offloaded_engine_keeps_its_graphs_in_the_memory_saver(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("SLIME_UNRELATED", "kept")
    fields = _fields()  # --colocate: --offload-rollout, the memory saver on
    assert fields["enable_memory_saver"] is True and fields["cuda_graph_backend_prefill"] == "disabled"
    argv = sa.server_command(fields)
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    env = SGLangEngine(fields, env={"EXTRA": "1"}).env
    assert env["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] == "true"
    assert env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "false"
    assert env["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] == "false"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert env["SLIME_UNRELATED"] == "kept" and env["EXTRA"] == "1"


def test_engine_without_memory_saver_keeps_the_default_prefill_graph():
    argv = [a for a in QWEN3_30B_A3B_ARGS if a != "--colocate"] + ["--rollout-num-gpus", "8"]
    fields = sa.sglang_server_args(parse_args(argv), engine_rank=0, num_engines=1, host="h", port=1, nccl_port=2,
                                   dist_init_addr=None, base_gpu_id=0)
    assert fields["enable_memory_saver"] is False and "cuda_graph_backend_prefill" not in fields
    env = SGLangEngine(fields).env
    assert "SGLANG_MEMORY_SAVER_CUDA_GRAPH" not in env
    assert env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "false"
