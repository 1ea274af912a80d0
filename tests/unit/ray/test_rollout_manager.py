"""RolloutManager on Ray: two local engines behind a real sglang-router serve whole rollouts.

One manager (fault tolerance on) serves the whole module: a 32 x 8 rollout keeps groups and
order, eval reports `eval/toy`, the data-source position survives save / load, and an engine
SIGKILLed in the middle of a rollout is restarted while the rollout still returns every sample.
"""

import argparse
import importlib.util
import os
import signal
from pathlib import Path

import pytest
import ray
import requests
import torch

from slime.ray.engines import ENGINE_KINDS, engine_positions, resolve_engine_kind
from slime.ray.placement import create_placement
from slime.backends.sglang_utils.router import list_workers
from slime.ray.rollout_manager import (
    RolloutManager,
    _HealthGate,
    build_train_data,
    eval_metrics,
    load_debug_samples,
    save_debug_samples,
)
from slime.utils.arguments import parse_args
from slime.utils.types import Sample
from tests.conftest import REPO_ROOT
from slime.utils.types import RolloutFnEvalOutput
from tests.unit.rollout.test_sglang_rollout import rollout_argv, start_router

N_PROMPTS, N_SAMPLES = 32, 8
KILL_FILE = "kill_engine_pid"


def kill_engine_hook(args, sample, *, rollout_id=None, evaluation=False):
    """`--rollout-sample-hook-path` used by the fault-tolerance test: when `{--save}/KILL_FILE`
    exists, SIGKILL the engine pid written in it (once), right after a sample finished."""
    path = Path(args.save) / KILL_FILE
    if path.exists():
        pid = int(path.read_text())
        path.unlink()
        os.kill(pid, signal.SIGKILL)
    return None


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=8, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def args(tiny_moe_hf, toy_data, tmp_path_factory):
    work = tmp_path_factory.mktemp("rollout_manager")
    return parse_args(rollout_argv(
        tiny_moe_hf, toy_data, N_PROMPTS, N_SAMPLES,
        "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "1", "--sglang-server-concurrency", "8",
        "--save", str(work), "--load", str(work),
        "--save-debug-rollout-data", str(work / "debug_{rollout_id}.pt"),
        "--use-fault-tolerance",
        "--rollout-sample-hook-path", "tests.unit.ray.test_rollout_manager.kill_engine_hook",
    ))


@pytest.fixture(scope="module")
def manager(ray_cluster, args):
    placement = create_placement(2, use_gpu=False)
    mgr = RolloutManager.remote(args, placement)
    yield mgr
    ray.get(mgr.shutdown.remote())
    ray.kill(mgr)


def check_rollout(data: dict, first_group: int | None = None) -> None:
    """Train data of one 32 x 8 rollout: right lengths, whole groups in order starting at
    `first_group` (None: wherever the data source stood)."""
    n = N_PROMPTS * N_SAMPLES
    for key in ("tokens", "response_lengths", "rewards", "raw_reward", "truncated", "sample_indices",
                "loss_masks", "rollout_log_probs"):
        assert len(data[key]) == n, key
    if first_group is None:
        assert data["sample_indices"][0] % N_SAMPLES == 0
        first_group = data["sample_indices"][0] // N_SAMPLES
    assert data["sample_indices"] == list(range(first_group * N_SAMPLES, first_group * N_SAMPLES + n))
    for length, mask, logprobs in zip(data["response_lengths"], data["loss_masks"], data["rollout_log_probs"]):
        assert 1 <= length <= 2 and len(mask) == length and len(logprobs) == length
    assert all(r in (0.0, 1.0) for r in data["raw_reward"])


def test_engine_kind_registry(args):
    assert set(ENGINE_KINDS) == {"local", "sglang"}
    assert resolve_engine_kind("auto", use_gpu=False) == "local"
    assert resolve_engine_kind(None, use_gpu=False) == "local"
    has_sglang = importlib.util.find_spec("sglang") is not None
    assert resolve_engine_kind("auto", use_gpu=True) == ("sglang" if has_sglang else "local")
    assert resolve_engine_kind("local", use_gpu=True) == "local"
    with pytest.raises(ValueError, match="--rollout-engine sglang: not available"):
        resolve_engine_kind("sglang", use_gpu=False)
    with pytest.raises(ValueError, match="--rollout-engine 'vllm'"):
        resolve_engine_kind("vllm", use_gpu=False)


def test_two_engines_serve_a_grouped_rollout(manager, args):
    urls = ray.get(manager.engine_urls.remote())
    assert len(urls) == 2 and len(set(urls)) == 2
    assert ray.get(manager.health_check.remote()) == [True, True]
    data, metrics = ray.get(manager.generate.remote(0))
    check_rollout(data, first_group=0)
    assert metrics["rollout/num_samples"] == N_PROMPTS * N_SAMPLES
    saved = torch.load(Path(args.save) / "debug_0.pt", weights_only=False)
    samples = [Sample.from_dict(d) for d in saved["samples"]]
    assert [s.index for s in samples] == list(range(N_PROMPTS * N_SAMPLES))
    for g in range(N_PROMPTS):
        group = samples[g * N_SAMPLES:(g + 1) * N_SAMPLES]
        assert {s.group_index for s in group} == {g}
        for s in group:
            assert s.tokens[-s.response_length:] and len(s.rollout_log_probs) == s.response_length
            assert s.reward is not None and s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)


def test_eval_reports_mean_reward(manager):
    metrics = ray.get(manager.eval.remote(0))
    assert 0.0 <= metrics["eval/toy"] <= 1.0
    assert 0.0 <= metrics["eval/toy/truncated_ratio"] <= 1.0


def test_data_source_position_saved_and_loaded(manager, args):
    ray.get(manager.save.remote(0))
    assert (Path(args.save) / "rollout" / "global_dataset_state_dict_0.pt").is_file()
    data, _ = ray.get(manager.generate.remote(1))
    check_rollout(data, first_group=N_PROMPTS)
    ray.get(manager.load.remote(0))
    data, _ = ray.get(manager.generate.remote(1))
    check_rollout(data, first_group=N_PROMPTS)


def test_engine_killed_mid_rollout_is_restarted(manager, args):
    pids = ray.get(manager.engine_pids.remote())
    old_urls = ray.get(manager.engine_urls.remote())
    (Path(args.save) / KILL_FILE).write_text(str(pids[0]))
    data, _ = ray.get(manager.generate.remote(2))
    assert not (Path(args.save) / KILL_FILE).exists()  # the hook fired during this rollout
    check_rollout(data)
    # The background monitor may already have restarted it; this round waits for that one.
    assert ray.get(manager.check_engines.remote()) in (0, 1)
    new_pids = ray.get(manager.engine_pids.remote())
    assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
    assert ray.get(manager.engine_urls.remote())[1] == old_urls[1]
    assert ray.get(manager.health_check.remote()) == [True, True]


def test_engine_positions_need_whole_engines(args):
    own = argparse.Namespace(**vars(args))
    own.rollout_num_gpus_per_engine = 2
    fake = argparse.Namespace(sorted_bundles=[0, 1, 2, 3])
    assert engine_positions(own, fake, rollout_bundles=(0, 1, 2, 3)) == [0, 2]
    with pytest.raises(ValueError, match="--rollout-num-gpus-per-engine 2"):
        engine_positions(own, fake, rollout_bundles=(0, 1, 2))
    with pytest.raises(ValueError, match="placement has 4 bundles"):
        engine_positions(own, fake, rollout_bundles=(4, 5))


def test_offload_releases_and_onload_resumes_every_engine(manager):
    def released():
        urls = ray.get(manager.engine_urls.remote())
        return [requests.get(f"{u}/get_server_info", timeout=10).json()["released"] for u in urls]

    held = ray.get(manager.memory_occupation.remote())
    assert held["held"]["weights"] > 0 and held["released"] == {}
    ray.get(manager.offload.remote())
    assert released() == [True, True]
    occupation = ray.get(manager.memory_occupation.remote())
    assert occupation["held"]["weights"] == 0
    assert occupation["released"] == {"weights": 2, "kv_cache": 2, "cuda_graph": 2}
    assert ray.get(manager.check_engines.remote()) == 0  # offloaded engines are not "restarted"
    ray.get(manager.onload.remote(["weights"], all_back=False))  # weights back, KV cache not yet
    assert released() == [True, True]
    assert ray.get(manager.check_engines.remote()) == 0
    ray.get(manager.onload.remote(["kv_cache", "cuda_graph"]))
    assert released() == [False, False]
    assert ray.get(manager.memory_occupation.remote()) == held


def test_existing_router_gets_the_engines_and_keeps_running(ray_cluster, args):
    router = start_router()
    try:
        own = argparse.Namespace(**vars(args))
        own.rollout_num_gpus, own.use_fault_tolerance, own.rollout_sample_hook_path = 1, False, None
        own.sglang_router_ip, own.sglang_router_port = router.host, router.port
        mgr = RolloutManager.remote(own, create_placement(1, use_gpu=False))
        urls = ray.get(mgr.engine_urls.remote())
        assert ray.get(mgr.router_address.remote()) == (router.host, router.port)
        assert list_workers(router.url) == urls
        ray.get(mgr.shutdown.remote())
        ray.kill(mgr)
        assert list_workers(router.url) == []  # unregistered, and the router still answers
    finally:
        router.stop()


@ray.remote(num_cpus=1)
class _BundleHolder:
    """Stands in for a colocated trainer rank, which holds the whole CPU of its bundle."""

    def ready(self) -> bool:
        return True


def test_engine_fits_beside_a_colocated_trainer_rank(ray_cluster, args):
    placement = create_placement(1, use_gpu=False)
    holder = _BundleHolder.options(scheduling_strategy=placement.strategy(0)).remote()
    assert ray.get(holder.ready.remote())
    own = argparse.Namespace(**vars(args))
    own.rollout_num_gpus, own.use_fault_tolerance, own.rollout_sample_hook_path = 1, False, None
    own.sglang_router_ip = own.sglang_router_port = None
    mgr = RolloutManager.remote(own, placement)
    try:
        assert ray.get(mgr.health_check.remote(), timeout=120) == [True]
    finally:
        ray.get(mgr.shutdown.remote())
        ray.kill(mgr)
        ray.kill(holder)


def _samples(n_groups: int, n: int) -> list[Sample]:
    return [
        Sample(group_index=g, index=g * n + j, prompt="1 mod 2", tokens=[5, 6, 7 + j], response_length=1,
               reward=float(j % 2), rollout_log_probs=[-0.5], status=Sample.Status.COMPLETED, label="1")
        for g in range(n_groups) for j in range(n)
    ]


def test_debug_rollout_data_round_trip(tmp_path):
    samples = _samples(2, 2)
    path = save_debug_samples(str(tmp_path / "r_{rollout_id}.pt"), 3, samples)
    assert path.endswith("r_3.pt")
    back = load_debug_samples(str(tmp_path / "r_{rollout_id}.pt"), 3)
    assert [s.to_dict() for s in back] == [s.to_dict() for s in samples]


def halve_rewards(args, samples):
    """--custom-reward-post-process-path used below."""
    raw = [s.reward for s in samples]
    return raw, [r / 2 for r in raw]


def tag_rollout(args, rollout_id, data):
    """--rollout-data-postprocess-path used below."""
    data["tag"] = rollout_id


def test_build_train_data_applies_the_plugins(args):
    own = argparse.Namespace(**vars(args))
    own.n_samples_per_prompt = 2
    own.custom_reward_post_process_path = f"{__name__}.halve_rewards"
    own.rollout_data_postprocess_path = f"{__name__}.tag_rollout"
    data = build_train_data(own, 7, _samples(2, 2))
    assert data["raw_reward"] == [0.0, 1.0, 0.0, 1.0] and data["rewards"] == [0.0, 0.5, 0.0, 0.5]
    assert data["sample_indices"] == [0, 1, 2, 3] and data["loss_masks"] == [[1]] * 4
    assert "tag" not in data  # --rollout-data-postprocess-path runs on the trainer (slime's call site)
    own.custom_reward_post_process_path = own.rollout_data_postprocess_path = None
    grpo = build_train_data(own, 7, _samples(2, 2))
    assert grpo["rewards"][0] < 0 < grpo["rewards"][1] and "tag" not in grpo


def test_eval_metrics_mean_reward_and_truncation():
    out = RolloutFnEvalOutput(data={"toy": {"rewards": [1, 0, 1, 1], "truncated": [True, False, False, False]}},
                              metrics={"eval/extra": 2.0})
    assert eval_metrics(out) == {"eval/toy": 0.75, "eval/toy/truncated_ratio": 0.25, "eval/extra": 2.0}


def test_offload_waits_for_the_health_round_under_way():
    """The fault-tolerance probe must not race a release: marking the engines offloaded waits
    for the round in progress, and no round probes once they are."""
    import threading

    gate = _HealthGate()
    with gate.round() as allowed:
        assert allowed
        offload = threading.Thread(target=gate.set_offloaded, args=(True,))
        offload.start()
        offload.join(timeout=0.5)
        assert offload.is_alive() and not gate.offloaded  # held back by the probing round
    offload.join()
    with gate.round() as allowed:
        assert not allowed
    gate.set_offloaded(False)
    with gate.round() as allowed:
        assert allowed
