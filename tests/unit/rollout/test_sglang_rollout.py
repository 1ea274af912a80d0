"""The default rollout against a real local engine behind the real sglang-router.

Args come from `parse_args` with the tiny MoE's MODEL_ARGS (read from its model script by bash),
prompts from the toy task. Checks the group structure of a train rollout, the eval data dict,
and that with `--use-fault-tolerance` a request whose engine is gone is re-sent until an engine
answers (bounded), while without it the failure surfaces at once.
"""

import asyncio
import subprocess
import threading
from types import SimpleNamespace

import pytest

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.backends.sglang_utils.router import RouterProcess, add_worker
from slime.rollout import router_requests, sglang_rollout
from slime.rollout.data_source import RolloutDataSourceWithBuffer
from slime.rollout.sglang_rollout import RolloutContext, generate_rollout
from slime.utils.arguments import parse_args
from slime.utils.engine_client import EngineClient, EngineHTTPError
from slime.utils.types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample
from tests.conftest import REPO_ROOT

from slime.utils.misc import free_port

N_PROMPTS, N_SAMPLES = 8, 4


def tiny_moe_model_args() -> list[str]:
    """MODEL_ARGS of scripts/models/qwen3-tiny-moe.sh, one array item per element."""
    out = subprocess.run(
        ["bash", "-c", 'set -euo pipefail; source scripts/models/qwen3-tiny-moe.sh; printf "%s\\n" "${MODEL_ARGS[@]}"'],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return out.splitlines()


def rollout_argv(hf_dir, data_dir, n_prompts: int, n_samples: int, *extra: str) -> list[str]:
    """A rollout-only command line for the tiny MoE on the toy task (2-token responses)."""
    return [
        *tiny_moe_model_args(), "--debug-rollout-only", "--hf-checkpoint", str(hf_dir),
        "--prompt-data", str(data_dir / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--rm-type", "math", "--rollout-batch-size", str(n_prompts), "--n-samples-per-prompt", str(n_samples),
        "--global-batch-size", str(n_prompts * n_samples), "--num-rollout", "2",
        "--rollout-max-response-len", "2", "--eval-prompt-data", "toy", str(data_dir / "eval.jsonl"),
        *extra,
    ]


def start_router(log_path=None) -> RouterProcess:
    """A router we own on a free port of 127.0.0.1."""
    return RouterProcess("127.0.0.1", free_port(), log_path=log_path).start()


@pytest.fixture(scope="module")
def router_with_engine(tiny_moe_hf, tmp_path_factory):
    """(router url, engine url): one local engine registered with a router we started."""
    logs = tmp_path_factory.mktemp("rollout_logs")
    port = free_port()
    engine = launch_local_engine(tiny_moe_hf, port, extra_args=("--num-threads", "1"), timeout=120,
                                 log_path=str(logs / "engine.log"))
    router = start_router(log_path=logs / "router.log")
    engine_url = f"http://127.0.0.1:{port}"
    add_worker(router.url, engine_url)
    yield router, engine_url
    router.stop()
    stop_local_engine(engine)


@pytest.fixture
def args(tiny_moe_hf, toy_data, router_with_engine):
    router, _ = router_with_engine
    return parse_args(rollout_argv(tiny_moe_hf, toy_data, N_PROMPTS, N_SAMPLES, "--rollout-num-gpus", "1",
                                   "--sglang-router-ip", router.host, "--sglang-router-port", str(router.port)))


def test_train_rollout_keeps_groups_and_order(args):
    source = RolloutDataSourceWithBuffer(args)
    out = generate_rollout(args, 0, source)
    assert isinstance(out, RolloutFnTrainOutput) and len(out.samples) == N_PROMPTS
    for g, group in enumerate(out.samples):
        assert len(group) == N_SAMPLES
        assert [s.group_index for s in group] == [g] * N_SAMPLES
        assert [s.index for s in group] == list(range(g * N_SAMPLES, (g + 1) * N_SAMPLES))
        for s in group:
            assert 1 <= s.response_length <= 2 and len(s.rollout_log_probs) == s.response_length
            assert all(lp <= 0.0 for lp in s.rollout_log_probs)
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
            assert s.reward in (0, 1)
    assert out.metrics["rollout/aborted_groups"] == 0.0
    assert source.sample_group_index == N_PROMPTS  # nothing drawn beyond the batch


def test_eval_rollout_scores_every_eval_prompt(args, toy_data):
    out = generate_rollout(args, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput) and set(out.data) == {"toy"}
    n_eval = sum(1 for line in (toy_data / "eval.jsonl").read_text().splitlines() if line.strip())
    toy = out.data["toy"]
    assert len(toy["rewards"]) == len(toy["truncated"]) == len(toy["samples"]) == n_eval
    assert all(r in (0.0, 1.0) for r in toy["rewards"])


def _one_request(args):
    ctx = sglang_rollout.RolloutContext.create(args, 0)
    sample = Sample(prompt="12 mod 2", index=0, group_index=0)
    params = {**sglang_rollout.sampling_params_from_args(args), "max_new_tokens": 1}

    async def run():
        async with ctx.client:
            return await sglang_rollout.generate(args, sample, params, ctx=ctx)

    return asyncio.run(run())


def test_fault_tolerance_retries_until_an_engine_answers(args, router_with_engine):
    """A router with no engine answers 5xx: without fault tolerance that surfaces at once; with
    `--use-fault-tolerance` the request is re-sent and succeeds once an engine is registered."""
    _, engine_url = router_with_engine
    empty = start_router()
    try:
        args.sglang_router_ip, args.sglang_router_port = empty.host, empty.port
        with pytest.raises(EngineHTTPError):
            _one_request(args)
        args.use_fault_tolerance = True
        # Registered while the request is being retried (the retries span about 30 s).
        registrar = threading.Timer(0.3, add_worker, args=(empty.url, engine_url))
        registrar.start()
        sample = _one_request(args)
        registrar.join()
        assert sample.response_length == 1 and len(sample.rollout_log_probs) == 1
    finally:
        empty.stop()


def test_fault_tolerance_gives_up_after_bounded_attempts(args, monkeypatch):
    args.use_fault_tolerance = True
    calls = []

    async def failing(self, payload):
        calls.append(payload)
        raise EngineHTTPError(f"{self.base_url}/generate", 503, "engine gone")

    monkeypatch.setattr(EngineClient, "generate", failing)
    monkeypatch.setattr(router_requests, "FT_RETRY_BACKOFF_S", 0.0)
    with pytest.raises(EngineHTTPError, match="503"):
        _one_request(args)
    assert len(calls) == sglang_rollout.FT_MAX_ATTEMPTS


def test_client_errors_are_not_retried(args, monkeypatch):
    args.use_fault_tolerance = True
    calls = []

    async def bad_request(self, payload):
        calls.append(payload)
        raise EngineHTTPError(f"{self.base_url}/generate", 400, "bad request")

    monkeypatch.setattr(EngineClient, "generate", bad_request)
    with pytest.raises(EngineHTTPError, match="400"):
        _one_request(args)
    assert len(calls) == 1


@pytest.mark.parametrize("flag, expected", [((), 1800.0), (("--router-request-timeout-secs", "7200"), 7200.0)])
def test_rollout_client_waits_as_long_as_the_router(tiny_moe_hf, toy_data, flag, expected):
    """The rollout's client timeout is the router's request timeout (--router-request-timeout-secs,
    else sglang-router's 1800 s), not a shorter one of its own."""
    args = parse_args(rollout_argv(tiny_moe_hf, toy_data, N_PROMPTS, N_SAMPLES, "--rollout-num-gpus", "1",
                                   "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "1", *flag))
    client = sglang_rollout.router_client(args)
    assert client.timeout.total == expected and client.base_url == "http://127.0.0.1:1"


SEEN: dict = {}


def mark_first_group_removed(args, groups):
    """--rollout-sample-filter-path used below: return value is ignored, remove_sample is kept."""
    SEEN["filter"] = [[s.index for s in g] for g in groups]
    for s in groups[0]:
        s.remove_sample = True
    return "ignored"


def count_all_groups(args, groups, get_samples):
    """--rollout-all-samples-process-path used below."""
    SEEN["all"] = (len(groups), callable(get_samples))


def drop_first_finished_group(args, samples, **kwargs):
    """Drops whichever group finishes first: with 3 groups in flight and 2 to keep, all 3 must then
    finish (dropping group 0 by index raced: when groups 1 and 2 finished first, 0 was aborted)."""
    if "dropped" in SEEN:
        return True
    SEEN["dropped"] = samples[0].group_index
    return False


def test_after_rollout_plugins_see_kept_and_all_groups(args):
    args.rollout_sample_filter_path = f"{__name__}.mark_first_group_removed"
    args.rollout_all_samples_process_path = f"{__name__}.count_all_groups"
    args.dynamic_sampling_filter_path = f"{__name__}.drop_first_finished_group"
    args.rollout_batch_size, args.over_sampling_batch_size = 2, 3
    SEEN.clear()
    out = generate_rollout(args, 0, RolloutDataSourceWithBuffer(args))
    assert len(out.samples) == 2 and all(s.remove_sample for s in out.samples[0])
    assert not any(s.remove_sample for s in out.samples[1])
    assert SEEN["filter"] == [[s.index for s in g] for g in out.samples]
    assert SEEN["dropped"] not in {g[0].group_index for g in out.samples}
    assert SEEN["all"] == (3, True)  # the two kept groups and the filtered-out one


def test_partial_rollout_hands_unfinished_groups_back_and_continues_them(args):
    args.partial_rollout = True
    args.rollout_batch_size, args.over_sampling_batch_size = 2, 4
    args.rollout_max_response_len = 6
    source = RolloutDataSourceWithBuffer(args)
    first = generate_rollout(args, 0, source)
    assert len(first.samples) == 2
    spare = {g[0].group_index for g in source.buffer}
    assert len(spare) == 2 == first.metrics["rollout/aborted_groups"]  # 4 in flight, 2 kept
    assert spare.isdisjoint({g[0].group_index for g in first.samples})
    partial = {s.index: s.response_length for g in source.buffer for s in g if s.status == Sample.Status.ABORTED}
    second = generate_rollout(args, 1, source)
    seen = {g[0].group_index for g in second.samples} | {g[0].group_index for g in source.buffer}
    assert spare <= seen
    assert source.sample_group_index == 6  # rollout 1 drew the 2 handed-back groups before 2 new prompts
    for group in second.samples:
        for s in group:
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
            assert len(s.rollout_log_probs) == s.response_length <= 6
            assert s.response_length >= partial.get(s.index, 0)  # continued, not restarted


def test_generate_and_rm_with_slimes_signature(args):
    params = {**sglang_rollout.sampling_params_from_args(args), "max_new_tokens": 1}
    sample = asyncio.run(sglang_rollout.generate_and_rm(args, Sample(prompt="12 mod 2", index=0, label="0"), params))
    assert isinstance(sample, Sample) and sample.response_length == 1 and sample.reward in (0, 1)
    group = [Sample(prompt="3 mod 2", index=i, label="1") for i in range(2)]
    out = asyncio.run(sglang_rollout.generate_and_rm_group(args, group, params, evaluation=True))
    assert [s.index for s in out] == [0, 1] and all(s.reward is not None for s in out)


def test_response_budget_fits_prompt_and_response_into_the_context():
    """--rollout-max-context-len cuts max_new_tokens to what is left of the context (slime's rule);
    a partial response counts against both limits; a full context leaves nothing."""
    from types import SimpleNamespace

    from slime.rollout.generate_output import response_budget as budget
    sample = Sample(tokens=[1] * 10, response_length=0)
    assert budget(SimpleNamespace(rollout_max_context_len=None), sample, 8) == 8
    assert budget(SimpleNamespace(rollout_max_context_len=14), sample, 8) == 4
    assert budget(SimpleNamespace(rollout_max_context_len=100), sample, 8) == 8
    partial = Sample(tokens=[1] * 12, response_length=2)
    assert budget(SimpleNamespace(rollout_max_context_len=14), partial, 8) == 2
    assert budget(SimpleNamespace(rollout_max_context_len=12), partial, 8) == 0


def test_generate_keeps_the_engines_routed_experts_with_r3(args):
    """--use-rollout-routing-replay: /generate asks for routed experts (through the router) and the
    sample keeps them as [len(tokens) - 1, num_layers, topk] (SGLang's rows: every fed token)."""
    import numpy as np

    args.use_rollout_routing_replay = True
    params = {**sglang_rollout.sampling_params_from_args(args), "max_new_tokens": 2}
    sample = asyncio.run(sglang_rollout.generate(args, Sample(prompt="12 mod 2", index=0), params))
    routed = np.asarray(sample.rollout_routed_experts)
    assert routed.shape == (len(sample.tokens) - 1, args.num_layers, args.moe_router_topk)
    assert routed.min() >= 0 and routed.max() < args.num_experts


def test_a_prompt_is_tokenized_once_per_rollout_call():
    """The samples of a group share their prompt: one tokenizer call, a fresh list for each."""
    calls = []

    def tokenizer(prompt, add_special_tokens):
        calls.append(prompt)
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in (prompt if isinstance(prompt, str) else "".join(prompt))]}

    ctx = RolloutContext(args=None, rollout_id=0, client=None, state=SimpleNamespace(tokenizer=tokenizer))
    first, second = ctx.prompt_ids("ab"), ctx.prompt_ids("ab")
    assert first == second == [97, 98] and first is not second
    first.append(0)  # a sample extending its tokens leaves the next sample's prompt alone
    assert ctx.prompt_ids("ab") == [97, 98]
    assert ctx.prompt_ids(["c"]) == [99] and ctx.prompt_ids(["c"]) == [99]  # not text: not kept
    assert calls == ["ab", ["c"], ["c"]]
