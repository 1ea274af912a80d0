"""`--rollout-group-requests`: one batched `/generate` per prompt group, straight to an engine,
against the local engine behind the real sglang-router (fixtures of test_sglang_rollout).

Checked: the same tokens, rewards and statuses per sample index as one request per sample (train
and eval rollouts, a group larger than the concurrency), that the requests really are one batch
per group with each sample's own seed, an in-flight batch aborted (its samples ABORTED with what
they generated), the per-sample fallback for custom generation, and fault tolerance (a failed
batch re-sent whole to the engine listed next; without the flag's companion it surfaces).
"""

import asyncio
from types import SimpleNamespace

import aiohttp
import pytest

from slime.rollout import direct_engines, router_requests, sglang_rollout
from slime.rollout.data_source import RolloutDataSourceWithBuffer
from slime.rollout.generate_state import GenerateState
from slime.rollout.group_requests import per_sample_reason
from slime.rollout.sglang_rollout import RolloutContext, generate_rollout, sample_seed
from slime.utils.engine_client import EngineClient, EngineHTTPError
from slime.utils.types import Sample
from slime.utils.arguments import parse_args
from tests.unit.rollout.test_sglang_rollout import N_PROMPTS, N_SAMPLES, rollout_argv
from tests.unit.rollout.test_sglang_rollout import args, router_with_engine  # noqa: F401 fixtures

CALLS: list = []


@pytest.fixture
def spy(monkeypatch):
    """Every /generate body sent, with the URL it went to (the real request still goes out)."""
    real = EngineClient.generate
    sent = []

    async def generate(self, payload):
        sent.append((self.base_url, payload))
        return await real(self, payload)

    monkeypatch.setattr(EngineClient, "generate", generate)
    return sent


def _by_index(groups):
    return {s.index: s for g in groups for s in g}


def _same_samples(plain: dict, grouped: dict) -> None:
    assert plain.keys() == grouped.keys()
    for i, a in plain.items():
        b = grouped[i]
        assert (a.tokens, a.response, a.response_length, a.status, a.reward, a.loss_mask) == \
            (b.tokens, b.response, b.response_length, b.status, b.reward, b.loss_mask), f"sample {i}"
        assert a.rollout_log_probs == pytest.approx(b.rollout_log_probs, abs=1e-4), f"sample {i}"


def test_a_group_request_draws_what_per_sample_requests_draw(tiny_moe_hf, toy_data, router_with_engine, spy):
    """Train and eval rollouts (3 samples per eval prompt) with the flag: the same tokens, rewards
    and statuses per sample index as without it; one batched body per group, to the engine (not
    the router), each prompt with its own sample's seed."""
    router, engine_url = router_with_engine
    args = parse_args(rollout_argv(tiny_moe_hf, toy_data, N_PROMPTS, N_SAMPLES, "--rollout-num-gpus", "1",
                                   "--sglang-router-ip", router.host, "--sglang-router-port", str(router.port),
                                   "--n-samples-per-eval-prompt", "3", "--rollout-max-response-len", "3"))
    plain = generate_rollout(args, 5, RolloutDataSourceWithBuffer(args))
    plain_eval = generate_rollout(args, 5, None, evaluation=True)
    assert all(url == router.url for url, _ in spy) and len(spy) > len(plain.samples)
    spy.clear()
    args.rollout_group_requests = True
    grouped = generate_rollout(args, 5, RolloutDataSourceWithBuffer(args))
    train_bodies = list(spy)
    grouped_eval = generate_rollout(args, 5, None, evaluation=True)
    _same_samples(_by_index(plain.samples), _by_index(grouped.samples))
    _same_samples(_by_index([plain_eval.data["toy"]["samples"]]), _by_index([grouped_eval.data["toy"]["samples"]]))
    assert plain_eval.data["toy"]["rewards"] == grouped_eval.data["toy"]["rewards"]
    n_eval = len(grouped_eval.data["toy"]["samples"]) // 3
    assert len(train_bodies) == len(grouped.samples) and len(spy) == len(train_bodies) + n_eval
    assert all(url == engine_url for url, _ in spy)
    seeds = {p["sampling_seed"] for _, body in train_bodies for p in body["sampling_params"]}
    assert seeds == {sample_seed(args, 5, s) for g in grouped.samples for s in g}
    for _, body in train_bodies:
        assert len(body["input_ids"]) == len(body["sampling_params"]) == len(grouped.samples[0])
        assert all(isinstance(ids, list) for ids in body["input_ids"])


def test_a_group_larger_than_the_concurrency_goes_in_chunks(args, spy):
    """4 samples, 3 permits: a batch of 3 and one of 1, the same tokens as per sample."""
    args.sglang_server_concurrency = 3  # read when the job's GenerateState is built (below)
    args.rollout_batch_size = args.over_sampling_batch_size = 1
    plain = generate_rollout(args, 0, RolloutDataSourceWithBuffer(args))
    spy.clear()
    args.rollout_group_requests = True
    grouped = generate_rollout(args, 0, RolloutDataSourceWithBuffer(args))
    assert GenerateState(args).concurrency == 3
    assert sorted(len(body["input_ids"]) for _, body in spy) == [1, 3]
    _same_samples(_by_index(plain.samples), _by_index(grouped.samples))


def test_an_aborted_batch_ends_aborted_with_what_it_generated(args, router_with_engine, spy):
    """`_abort_engines` while a group's batch is generating: every sample comes back ABORTED, with
    the tokens and log-probs it generated so far, unrewarded; a later group sees the abort flag
    and sends nothing."""
    _, engine_url = router_with_engine
    args.rollout_group_requests = True
    params = {**sglang_rollout.sampling_params_from_args(args), "max_new_tokens": 480, "ignore_eos": True}
    group = [Sample(prompt="12 mod 2", index=i, group_index=0, label="0") for i in range(4)]

    async def run():
        ctx = RolloutContext.create(args, 0)
        async with ctx, EngineClient(engine_url) as engine:
            task = asyncio.create_task(sglang_rollout.generate_and_rm_group(ctx, group, params))
            while (await engine.get_server_info())["running"] < 4:  # until the engine runs the batch
                assert not task.done(), "the batch finished before it could be aborted"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            await sglang_rollout._abort_engines(ctx)
            out = await task
            late = [Sample(prompt="3 mod 2", index=9, group_index=1, label="1") for _ in range(2)]
            return out, await sglang_rollout.generate_and_rm_group(ctx, late, params)

    try:
        out, late = asyncio.run(run())
    finally:
        GenerateState(args).reset()
    assert len(spy) == 1 and len(spy[0][1]["input_ids"]) == 4
    for s in out:
        assert s.status == Sample.Status.ABORTED and s.reward is None, [(s.status, s.response_length) for s in out]
        assert s.response_length < 480 and len(s.rollout_log_probs) == s.response_length
        assert s.tokens[:len(s.tokens) - s.response_length] == group[0].tokens[:len(s.tokens) - s.response_length]
    assert all(s.status == Sample.Status.ABORTED and s.response_length == 0 for s in late) and len(spy) == 1


def test_partial_rollout_continues_batched_samples(args):
    """Over-sampling with --partial-rollout: spare groups are aborted and handed back; the next
    rollout continues them in batches (never restarts them) and finishes every kept sample."""
    args.rollout_group_requests = True
    args.partial_rollout = True
    args.rollout_batch_size, args.over_sampling_batch_size = 2, 4
    args.rollout_max_response_len = 6
    source = RolloutDataSourceWithBuffer(args)
    first = generate_rollout(args, 0, source)
    assert len(first.samples) == 2 and first.metrics["rollout/aborted_groups"] == 2
    partial = {s.index: s.response_length for g in source.buffer for s in g}
    assert len(partial) == 8
    second = generate_rollout(args, 1, source)
    for group in second.samples:
        for s in group:
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
            assert len(s.rollout_log_probs) == s.response_length <= 6
            assert s.response_length >= partial.get(s.index, 0)


async def count_and_generate(args, sample, sampling_params):
    """--custom-generate-function-path used below: slime's default generation, counted."""
    CALLS.append(sample.index)
    return await sglang_rollout.generate(args, sample, sampling_params)


def test_custom_generation_keeps_one_request_per_sample(args, router_with_engine, spy):
    router, _ = router_with_engine
    args.rollout_group_requests = True
    args.custom_generate_function_path = f"{__name__}.count_and_generate"
    args.rollout_batch_size = args.over_sampling_batch_size = 2
    CALLS.clear()
    out = generate_rollout(args, 0, RolloutDataSourceWithBuffer(args))
    assert sorted(CALLS) == sorted(s.index for g in out.samples for s in g)
    assert len(spy) == len(CALLS) and all(url == router.url and isinstance(b["input_ids"][0], int) for url, b in spy)


def test_per_sample_reasons():
    def ctx(custom=None, **flags):
        args = SimpleNamespace(rollout_group_requests=True, use_rollout_routing_replay=False)
        vars(args).update(flags)
        return SimpleNamespace(args=args, custom_generate=custom)

    plain = [Sample(index=0), Sample(index=1)]
    assert per_sample_reason(ctx(), plain) is None
    assert "off" in per_sample_reason(ctx(rollout_group_requests=False), plain)
    assert "--custom-generate-function-path" in per_sample_reason(ctx(custom=print), plain)
    assert "generate_function_path" in per_sample_reason(ctx(), [Sample(index=0, generate_function_path="m.f")])
    assert "routing-replay" in per_sample_reason(ctx(use_rollout_routing_replay=True), plain)
    assert "one sample" in per_sample_reason(ctx(), plain[:1])


def _one_group(args, n=2):
    group = [Sample(prompt="12 mod 2", index=i, group_index=0, label="0") for i in range(n)]
    params = {**sglang_rollout.sampling_params_from_args(args), "max_new_tokens": 1}
    try:
        return asyncio.run(sglang_rollout.generate_and_rm_group(args, group, params))
    finally:
        GenerateState(args).reset()


def test_fault_tolerance_resends_a_failed_batch_to_the_engine_listed_next(args, router_with_engine, monkeypatch):
    """The first batch fails (a dead engine), the router then lists no engine once (it is being
    restarted): with --use-fault-tolerance the batch is re-sent whole after the router is asked
    again, and every sample gets exactly one response; without it the failure surfaces."""
    _, engine_url = router_with_engine
    real_generate, real_request = EngineClient.generate, EngineClient.request
    sent, listings = [], []

    async def generate(self, payload):
        sent.append(self.base_url)
        if len(sent) == 1:
            raise aiohttp.ClientConnectionError("engine gone")
        return await real_generate(self, payload)

    async def request(self, method, path, payload=None):
        if path == "/workers":
            listings.append(path)
            if len(listings) == 2:
                return {"workers": []}
        return await real_request(self, method, path, payload)

    monkeypatch.setattr(EngineClient, "generate", generate)
    monkeypatch.setattr(EngineClient, "request", request)
    monkeypatch.setattr(router_requests, "FT_RETRY_BACKOFF_S", 0.0)
    args.rollout_group_requests = True
    with pytest.raises(aiohttp.ClientConnectionError):
        _one_group(args)
    sent.clear(), listings.clear()
    args.use_fault_tolerance = True
    out = _one_group(args)
    assert sent == [engine_url, engine_url] and len(listings) == 3  # listed, failed, none listed, listed
    assert [s.index for s in out] == [0, 1]
    for s in out:
        assert s.response_length == 1 and len(s.rollout_log_probs) == 1 and s.reward in (0, 1)


def test_no_engine_listed_is_a_connection_failure():
    assert issubclass(direct_engines.NoEngineListed, aiohttp.ClientConnectionError)
    assert router_requests._retryable(direct_engines.NoEngineListed("none"))
    assert not router_requests._retryable(EngineHTTPError("u", 400, "bad"))


def test_concurrent_first_picks_list_the_engines_once_and_share_their_clients():
    """A rollout's groups all pick at once: one `GET /workers`, one client (one HTTP session) per
    engine, round robin over them, every one closed with the rollout (none left unclosed)."""
    listings = []

    class Router:
        base_url, timeout = "http://router", aiohttp.ClientTimeout(total=5)

        async def request(self, method, path):
            listings.append(path)
            await asyncio.sleep(0.01)  # the other picks arrive while this one waits
            return {"workers": [{"url": "http://e0"}, {"url": "http://e1"}]}

    async def run():
        engines = direct_engines.DirectEngines(Router())
        picked = await asyncio.gather(*(engines.pick() for _ in range(6)))
        sessions = [c._sess() for c in picked[:2]]
        await engines.close()
        return picked, sessions

    picked, sessions = asyncio.run(run())
    assert listings == ["/workers"]
    assert [c.base_url for c in picked] == ["http://e0", "http://e1"] * 3
    assert len({id(c) for c in picked}) == 2 and all(s.closed for s in sessions)


def test_slots_hold_several_permits_without_deadlock():
    """Two 3-permit holders and a 1-permit one on a 4-permit semaphore all get through, never
    more than 4 permits out at once."""
    state = object.__new__(GenerateState)
    state.concurrency, state._semaphore, state._semaphore_loop, state._slots_lock = 4, None, None, None
    held, peak = [0], [0]

    async def take(n):
        async with state.slots(n):
            held[0] += n
            peak[0] = max(peak[0], held[0])
            await asyncio.sleep(0.01)
            held[0] -= n

    async def run():
        await asyncio.wait_for(asyncio.gather(take(3), take(3), take(1), take(4)), timeout=5)

    asyncio.run(run())
    assert peak[0] <= 4 and held[0] == 0
    with pytest.raises(ValueError, match="sglang-server-concurrency"):
        asyncio.run(take(5))


def test_rollouts_on_the_background_loop_reuse_the_jobs_clients_and_connections(args, monkeypatch):
    """Two train rollouts with group requests: the same engine and router clients (one session
    each, idle connections dropped before the servers' keep-alive), and the second rollout opens
    no new connection; `close_job_clients` closes them at the job's end."""
    from slime.rollout.client_pool import KEEPALIVE_S
    from slime.rollout.generate_state import close_job_clients

    connects = []
    real_connect = aiohttp.TCPConnector._create_connection

    async def counted(self, req, traces, timeout):
        connects.append(req.url.port)
        return await real_connect(self, req, traces, timeout)

    monkeypatch.setattr(aiohttp.TCPConnector, "_create_connection", counted)
    args.rollout_group_requests = True
    source = RolloutDataSourceWithBuffer(args)
    clients = []
    for rollout_id in (0, 1):
        generate_rollout(args, rollout_id, source)
        pool = GenerateState(args)._pool
        clients.append(list(pool._clients.values()))
        if rollout_id == 0:
            first_connects = len(connects)
    assert [c.base_url for c in clients[0]] == [c.base_url for c in clients[1]]
    assert all(a is b and a._session is b._session for a, b in zip(*clients))
    assert all(c._session.connector._keepalive_timeout == KEEPALIVE_S for c in clients[1])
    assert first_connects > 0 and len(connects) == first_connects, "the second rollout reconnected"
    close_job_clients(args)
    assert all(c._session is None for c in clients[1]) and GenerateState(args)._pool is None


def test_a_rollout_on_its_own_loop_closes_its_clients(args):
    """Outside the background loop (a custom rollout's `asyncio.run`) no pool is used: the call's
    clients are its own and closed when it ends."""
    args.rollout_group_requests = True
    opened = []
    real = RolloutContext.create

    def create(*a, **kw):
        ctx = real(*a, **kw)
        opened.append(ctx)
        return ctx

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RolloutContext, "create", create)
        out = _one_group(args)
    assert len(out) == 2 and GenerateState(args)._pool is None
    ctx = opened[0]
    assert ctx.pool is None and ctx.client._session is None
