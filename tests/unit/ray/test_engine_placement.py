"""SGLang engines with several GPUs and across nodes under Ray, on faked placements (no GPUs):
which GPUs and nodes each engine process gets, the actor's NOSET visible-devices variables, and
the launch line the engine actor's own launch path builds (started through a launcher that is
never run: `SGLangEngine.start` is replaced by a recorder)."""

import argparse

import pytest

from slime.backends.sglang_utils import engine as sglang_engine
from slime.ray import engines
from slime.ray.placement import JobPlacement
from slime.utils.arguments import parse_args
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS

NOSET = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1",
         "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}


def fake_placement(num_nodes: int, gpus_per_node: int = 8) -> JobPlacement:
    """Sorted bundles as create_placement reports them: (node IP, node id, GPU id)."""
    locations = [(f"10.0.0.{n + 1}", f"node{n}", g) for n in range(num_nodes) for g in range(gpus_per_node)]
    return JobPlacement(group=None, sorted_bundles=list(range(len(locations))), locations=locations, use_gpu=True)


def _args(*extra):
    return parse_args(QWEN3_30B_A3B_ARGS + list(extra))


def _launch_line(monkeypatch, args, node, engine_rank=0, dist_init_addr=None):
    """The SGLangEngine the engine actor's `_launch_sglang` builds for `node`, not started."""
    monkeypatch.setattr(sglang_engine.SGLangEngine, "start", lambda self, timeout: self)
    engine = engines._launch_sglang(args, engine_rank=engine_rank, host="127.0.0.1", port=30000, num_threads=1,
                                    log_path=None, node=node, dist_init_addr=dist_init_addr)
    argv = engine.command
    return engine, {flag: argv[argv.index(flag) + 1] for flag in ("--tp-size", "--base-gpu-id", "--nnodes",
                                                                 "--node-rank") if flag in argv}


@pytest.mark.parametrize("per_engine, expected", [
    (4, [(0, (0, 1, 2, 3)), (4, (4, 5, 6, 7))]),  # 2 engines x TP4
    (8, [(0, tuple(range(8)))]),  # 1 engine x TP8
])
def test_engines_get_all_their_gpus(monkeypatch, per_engine, expected):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = _args("--rollout-num-gpus-per-engine", str(per_engine), "--sglang-ep-size", str(per_engine),
                 "--sglang-dp-size", str(per_engine))
    placement = fake_placement(1)
    positions = engines.engine_positions(args, placement, tuple(range(8)))
    assert positions == [position for position, _ in expected]
    for rank, (position, devices) in enumerate(expected):
        (node,) = engines.engine_nodes(placement, position, per_engine)
        assert (node.node_rank, node.nnodes, node.device_ids) == (0, 1, devices)
        options = engines.engine_actor_options(placement, position, "sglang")
        assert options["runtime_env"]["env_vars"] == NOSET  # the actor sees the node's every GPU
        engine, flags = _launch_line(monkeypatch, args, node, engine_rank=rank)
        assert flags == {"--tp-size": str(per_engine), "--base-gpu-id": str(position), "--nnodes": "1",
                         "--node-rank": "0"}
        assert "CUDA_VISIBLE_DEVICES" not in engine.env  # inherited as Ray left it: unset, all GPUs
        engine._check_devices()


def test_base_gpu_id_counts_within_the_nodes_visible_devices(monkeypatch):
    """A node whose Ray lists GPUs 2,3,6,7: the engine on Ray GPUs 6,7 starts at index 2."""
    assert engines.base_gpu_id((6, 7), "2,3,6,7") == 2
    assert engines.base_gpu_id((4, 5, 6, 7), None) == 4
    with pytest.raises(ValueError, match="not consecutive"):
        engines.base_gpu_id((3, 7), "2,3,6,7")
    with pytest.raises(ValueError, match="not consecutive"):
        engines.base_gpu_id((1, 3), None)
    with pytest.raises(ValueError, match="not in CUDA_VISIBLE_DEVICES"):
        engines.base_gpu_id((0, 1), "2,3")


def test_local_engine_actor_keeps_rays_single_gpu():
    options = engines.engine_actor_options(fake_placement(1), 3, "local")
    assert "runtime_env" not in options and options["num_gpus"] == 0.2


def test_engine_across_two_nodes_gets_one_process_per_node(monkeypatch):
    """TP16 on 2 x 8 GPUs: node rank 0 on node 0, rank 1 on node 1, the same dist_init_addr."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = _args("--actor-num-nodes", "2", "--rollout-num-gpus", "16", "--rollout-num-gpus-per-engine", "16",
                 "--sglang-ep-size", "16", "--sglang-dp-size", "16")
    placement = fake_placement(2)
    nodes = engines.engine_nodes(placement, 0, 16)
    assert [(n.node_rank, n.nnodes, n.position, n.device_ids) for n in nodes] == [
        (0, 2, 0, tuple(range(8))), (1, 2, 8, tuple(range(8)))]
    for node in nodes:
        engine, flags = _launch_line(monkeypatch, args, node, dist_init_addr="10.0.0.1:29500")
        assert flags == {"--tp-size": "16", "--base-gpu-id": "0", "--nnodes": "2", "--node-rank": str(node.node_rank)}
        argv = engine.command
        assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:29500"
        assert engine.serves_http == (node.node_rank == 0)


def test_engine_spanning_nodes_unevenly_is_refused():
    placement = fake_placement(2)
    with pytest.raises(ValueError, match="unevenly"):
        engines.engine_nodes(placement, 4, 12)  # 4 GPUs on node 0, 8 on node 1


def test_engine_start_timeout_comes_from_the_flag(monkeypatch):
    seen = {}
    monkeypatch.setattr(sglang_engine.SGLangEngine, "start", lambda self, timeout: seen.setdefault("t", timeout))
    args = _args("--engine-start-timeout", "1800")
    sglang_engine.launch(args, engine_rank=0, host="127.0.0.1", port=30000, nccl_port=30001)
    assert seen["t"] == 1800
    assert parse_args(QWEN3_30B_A3B_ARGS).engine_start_timeout == 600


def test_local_engine_start_timeout_comes_from_the_flag(monkeypatch):
    seen = {}
    monkeypatch.setattr(engines, "launch_local_engine", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr(engines.ray, "get_gpu_ids", lambda: [])
    args = argparse.Namespace(hf_checkpoint="/m", seed=1, engine_start_timeout=1234.0)
    engines._launch_local(args, engine_rank=0, host="127.0.0.1", port=1, num_threads=1, log_path=None)
    assert seen["timeout"] == 1234.0


def test_local_engine_takes_the_sglang_batch_cap(monkeypatch):
    """--sglang-max-running-requests reaches the local engine's --max-running-requests (unset: its default)."""
    seen = {}
    monkeypatch.setattr(engines, "launch_local_engine", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr(engines.ray, "get_gpu_ids", lambda: [])
    for cap, expected in ((None, None), (1, 1)):
        args = argparse.Namespace(hf_checkpoint="/m", seed=1, engine_start_timeout=60.0, sglang_max_running_requests=cap)
        engines._launch_local(args, engine_rank=0, host="127.0.0.1", port=1, num_threads=1, log_path=None)
        extra = list(seen["extra_args"])
        got = extra[extra.index("--max-running-requests") + 1] if "--max-running-requests" in extra else None
        assert got == expected
