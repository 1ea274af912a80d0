"""The local engine over real HTTP: greedy parity with transformers, sampling distribution, logprobs,
finish reasons, concurrency, validation, pause/continue and abort."""

import asyncio
import json
import math
import time

import pytest
import requests
import torch
from transformers import AutoModelForCausalLM

from slime.utils.engine_client import EngineClient, EngineHTTPError, SyncEngineClient
from tests.unit.backends.local_engine.conftest import hf_greedy, hf_logprobs

PROMPTS = [[5, 9, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [40, 41, 42, 43, 44, 45], list(range(60, 95))]


@pytest.fixture(scope="module")
def url(engine_factory, tiny_moe_hf):
    return engine_factory(tiny_moe_hf, "--max-running-requests", "64", "--context-length", "256")


@pytest.fixture(scope="module")
def hf_model(tiny_moe_hf):
    return AutoModelForCausalLM.from_pretrained(tiny_moe_hf, dtype=torch.float32).eval()


def _gather(url, payloads):
    async def run():
        async with EngineClient(url) as client:
            return await asyncio.gather(*(client.generate(p) for p in payloads))

    return asyncio.run(run())


def _greedy(ids, n, **extra):
    return {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, **extra}, "return_logprob": True}


def test_greedy_matches_transformers_generate_with_ragged_batch(url, hf_model):
    client = SyncEngineClient(url)

    async def run():  # queue all prompts while paused so they are prefilled and decoded as one ragged batch
        async with EngineClient(url) as c:
            await c.pause_generation()
            tasks = [asyncio.create_task(c.generate(_greedy(p, 24))) for p in PROMPTS]
            await asyncio.to_thread(_wait_for, client, "waiting", len(PROMPTS))
            await c.continue_generation()
            return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    for prompt, res in zip(PROMPTS, results):
        expected = hf_greedy(hf_model, prompt, 24)
        assert res["output_ids"] == expected
        assert res["meta_info"]["prompt_tokens"] == len(prompt)
        assert res["meta_info"]["completion_tokens"] == len(expected)


def test_logprobs_equal_a_separate_forward(url, hf_model):
    payloads = [_greedy(PROMPTS[1], 16)] + [
        {"input_ids": p, "sampling_params": {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 16, "sampling_seed": i},
         "return_logprob": True} for i, p in enumerate(PROMPTS)]
    for payload, res in zip(payloads, _gather(url, payloads)):
        entries = res["meta_info"]["output_token_logprobs"]
        assert [e[1] for e in entries] == res["output_ids"]
        got = torch.tensor([e[0] for e in entries])
        want = hf_logprobs(hf_model, payload["input_ids"], res["output_ids"], payload["sampling_params"]["temperature"])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def _chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of observed `counts` under `probs`, bins with expected < 5 merged into one."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


@pytest.mark.parametrize("temperature,top_k", [(0.3, -1), (0.3, 3)])
def test_first_sampled_token_follows_the_requested_distribution(url, hf_model, temperature, top_k):
    prompt, n = PROMPTS[2], 3000
    # explicit per-request seeds make the outcome deterministic (no flaky 1-in-1000 failures)
    body = {"input_ids": [prompt] * n, "sampling_params": [
        {"temperature": temperature, "top_k": top_k, "max_new_tokens": 1, "sampling_seed": 1000 + i} for i in range(n)]}
    results = SyncEngineClient(url).generate(body)
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k > 0:
        probs = torch.zeros_like(probs).scatter(0, probs.topk(top_k).indices, probs.topk(top_k).values)
        probs /= probs.sum()
    counts = torch.bincount(torch.tensor([r["output_ids"][0] for r in results]), minlength=probs.numel()).double()
    assert _chi_square_pvalue(counts, probs.double()) > 1e-3
    # the check has power: the untempered distribution is rejected
    assert _chi_square_pvalue(counts, torch.softmax(logits, dim=-1).double()) < 1e-3


def test_seeded_sampling_is_reproducible(url):
    body = {"input_ids": PROMPTS[0], "sampling_params": {"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 7}}
    a, b = _gather(url, [body, body])
    assert a["output_ids"] == b["output_ids"]


def test_finish_reasons_stop_strings_and_stop_tokens(url):
    client = SyncEngineClient(url)
    base = client.generate(_greedy(PROMPTS[1], 20, ignore_eos=True))
    assert base["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    assert len(base["output_ids"]) == 20
    # a stop token id: generation ends on its first occurrence, which stays in output_ids
    stop_tok = base["output_ids"][5]
    res = client.generate(_greedy(PROMPTS[1], 20, ignore_eos=True, stop_token_ids=[stop_tok]))
    first = base["output_ids"].index(stop_tok)
    assert res["output_ids"] == base["output_ids"][: first + 1]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok}
    # a stop string taken from the greedy text: trimmed from text unless no_stop_trim
    text = base["text"]
    stop = text[8:10]
    res = client.generate(_greedy(PROMPTS[1], 20, ignore_eos=True, stop=stop))
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert res["text"] == text[: text.index(stop)]
    kept = client.generate(_greedy(PROMPTS[1], 20, ignore_eos=True, stop=[stop], no_stop_trim=True))
    assert kept["text"].endswith(stop) and kept["output_ids"] == res["output_ids"]
    assert client.generate(_greedy(PROMPTS[0], 0))["meta_info"]["finish_reason"]["type"] == "length"


def test_text_input_and_batch_of_input_ids(url):
    client = SyncEngineClient(url)
    res = client.generate({"text": "abc", "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert isinstance(res, dict) and res["meta_info"]["prompt_tokens"] == 3
    batch = client.generate({"input_ids": PROMPTS[:2], "sampling_params": {"temperature": 0, "max_new_tokens": 3}})
    assert isinstance(batch, list) and [len(r["output_ids"]) for r in batch] == [3, 3]


def test_64_concurrent_requests_complete(url):
    payloads = [_greedy(PROMPTS[i % 4] + [i % 100], 4 + i % 13, ignore_eos=True) for i in range(64)]
    results = _gather(url, payloads)
    assert [len(r["output_ids"]) for r in results] == [4 + i % 13 for i in range(64)]
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)


BAD = [
    ("{not json", "malformed JSON"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}), "max_new_tokens"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"temperature": -0.5}}), "temperature"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}), "top_p"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"top_p": 1.5}}), "top_p"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}), "top_k"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"top_k": -2}}), "top_k"),
    (json.dumps({"input_ids": list(range(100)) * 3, "sampling_params": {"max_new_tokens": 8}}), "context length"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 255}}), "max_new_tokens"),
    (json.dumps({"input_ids": [1, 999]}), "input_ids"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"no_such_param": 1}}), "no_such_param"),
    (json.dumps({"input_ids": [1, 2], "stream": True}), "stream"),
    (json.dumps({"input_ids": [1, 2], "return_routed_experts": True, "routed_experts_start_len": 3}),
     "routed_experts_start_len"),
]


@pytest.mark.parametrize("body,needle", BAD)
def test_bad_requests_get_400_and_the_engine_keeps_serving(url, body, needle):
    resp = requests.post(f"{url}/generate", data=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == 400
    assert needle in resp.json()["error"]["message"]
    assert len(SyncEngineClient(url).generate(_greedy(PROMPTS[0], 2))["output_ids"]) == 2


def test_sglang_router_default_fields_are_accepted(url):
    body = {**_greedy(PROMPTS[0], 3), "model": "x", "stream": False, "return_text_in_logprobs": True,
            "log_metrics": True, "return_hidden_states": False, "return_entropy": False, "return_bytes": False,
            "background": False, "no_logs": False, "rid": "router-1", "logprob_start_len": -1, "top_logprobs_num": 0}
    res = SyncEngineClient(url).generate(body)
    assert res["meta_info"]["id"] == "router-1"
    assert all(isinstance(e[2], str) for e in res["meta_info"]["output_token_logprobs"])


def _wait_for(client: SyncEngineClient, key: str, value: int) -> None:
    deadline = time.monotonic() + 60
    while client.get_server_info()[key] != value:
        assert time.monotonic() < deadline, f"server never reached {key}={value}"
        time.sleep(0.02)


def test_pause_queues_requests_until_continue(url):
    client = SyncEngineClient(url)

    async def run():
        async with EngineClient(url) as c:
            await c.pause_generation()
            task = asyncio.create_task(c.generate(_greedy(PROMPTS[0], 5)))
            await asyncio.to_thread(_wait_for, client, "waiting", 1)
            assert not task.done()
            await c.continue_generation()
            return await task

    assert len(asyncio.run(run())["output_ids"]) == 5


def test_abort_all_returns_partial_results(url):
    client = SyncEngineClient(url)

    async def run():
        async with EngineClient(url) as c:
            long = asyncio.create_task(c.generate(_greedy(PROMPTS[0], 200, ignore_eos=True)))
            await asyncio.to_thread(_wait_for, client, "running", 1)
            await c.pause_generation(mode="in_place")
            queued = asyncio.create_task(c.generate(_greedy(PROMPTS[1], 5)))
            await asyncio.to_thread(_wait_for, client, "waiting", 1)
            await c.abort_request(abort_all=True)
            await c.continue_generation()
            return await long, await queued

    long, queued = asyncio.run(run())
    assert long["meta_info"]["finish_reason"]["type"] == "abort"
    assert 1 <= len(long["output_ids"]) < 200
    assert queued["meta_info"]["finish_reason"]["type"] == "abort" and queued["output_ids"] == []


def test_control_and_info_endpoints(url, tiny_moe_hf):
    client = SyncEngineClient(url)
    assert client.health()
    client.health_generate()
    client.flush_cache()
    assert requests.post(f"{url}/flush_cache", timeout=10).status_code == 200
    info = client.get_model_info()
    assert info["model_path"] == str(tiny_moe_hf) and info["is_generation"] is True
    assert client.get_weight_version() == "default" == requests.get(f"{url}/model_info", timeout=10).json()["weight_version"]
    assert client.get_server_info()["context_length"] == 256
    # SGLang serves no /get_weight_version; AbortReq with neither rid nor abort_all matches nothing (200)
    assert requests.get(f"{url}/get_weight_version", timeout=10).status_code == 404
    assert requests.post(f"{url}/abort_request", json={}, timeout=10).status_code == 200
    assert not math.isnan(client.generate(_greedy(PROMPTS[0], 1))["meta_info"]["output_token_logprobs"][0][0])


def test_pause_mode_abort_finishes_requests_in_flight(url):
    client = SyncEngineClient(url)

    async def run():
        async with EngineClient(url) as c:
            long = asyncio.create_task(c.generate(_greedy(PROMPTS[0], 200, ignore_eos=True)))
            await asyncio.to_thread(_wait_for, client, "running", 1)
            await c.pause_generation(mode="abort")
            result = await long
            await c.continue_generation()
            return result

    assert asyncio.run(run())["meta_info"]["finish_reason"]["type"] == "abort"
    with pytest.raises(EngineHTTPError):
        asyncio.run(_post(url, "/pause_generation", {"mode": "sideways"}))
    assert len(client.generate(_greedy(PROMPTS[0], 2))["output_ids"]) == 2


async def _post(url, path, payload):
    async with EngineClient(url) as c:
        return await c.request("POST", path, payload)


def test_input_token_logprobs_for_scoring_prompts(url, hf_model):
    prompt = PROMPTS[1]
    body = {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 0}}
    res = SyncEngineClient(url).generate(body)
    entries = res["meta_info"]["input_token_logprobs"]
    assert res["output_ids"] == [] and [e[1] for e in entries] == prompt and entries[0][0] is None
    want = hf_logprobs(hf_model, prompt[:1], prompt[1:], 1.0)
    torch.testing.assert_close(torch.tensor([e[0] for e in entries[1:]]), want, atol=1e-5, rtol=0)
    tail = SyncEngineClient(url).generate({**body, "logprob_start_len": 4})["meta_info"]["input_token_logprobs"]
    # SGLang's rule: the entry at logprob_start_len has no logprob, whatever the start
    assert tail[0] == [None, prompt[4], None] and tail[1:] == entries[5:]
    assert "input_token_logprobs" not in SyncEngineClient(url).generate(_greedy(prompt, 1))["meta_info"]


def test_dense_model_greedy_matches_transformers_and_bf16_serves(engine_factory, tiny_dense_hf):
    dense_url = engine_factory(tiny_dense_hf)
    model = AutoModelForCausalLM.from_pretrained(tiny_dense_hf, dtype=torch.float32).eval()
    results = _gather(dense_url, [_greedy(p, 10) for p in PROMPTS[:3]])
    assert [r["output_ids"] for r in results] == [hf_greedy(model, p, 10) for p in PROMPTS[:3]]
    bf16_url = engine_factory(tiny_dense_hf, "--dtype", "bfloat16")
    res = SyncEngineClient(bf16_url).generate(_greedy(PROMPTS[0], 5, ignore_eos=True))
    assert len(res["output_ids"]) == 5
    assert all(math.isfinite(e[0]) and e[0] <= 0 for e in res["meta_info"]["output_token_logprobs"])


def test_flush_cache_answers_400_while_a_request_runs(url):
    """SGLang's /flush_cache: 400 while a request is running (here held by an in-place pause), also
    after waiting ?timeout= seconds; 200 once the engine is idle."""
    client = SyncEngineClient(url)

    async def run():
        async with EngineClient(url) as c:
            long = asyncio.create_task(c.generate(_greedy(PROMPTS[0], 200, ignore_eos=True)))
            await asyncio.to_thread(_wait_for, client, "running", 1)
            await c.pause_generation(mode="in_place")
            busy = await asyncio.to_thread(requests.get, f"{url}/flush_cache", timeout=10)
            waited = await asyncio.to_thread(requests.get, f"{url}/flush_cache?timeout=0.2", timeout=10)
            await c.continue_generation()
            await long
            return busy, waited

    busy, waited = asyncio.run(run())
    assert busy.status_code == 400 and "#running-req: 1" in busy.text
    assert waited.status_code == 400
    assert requests.get(f"{url}/flush_cache", timeout=10).status_code == 200


def test_pause_without_mode_aborts_like_sglang_and_flush_then_succeeds(url):
    """PauseGenerationReqInput's mode defaults to "abort": a bare pause finishes the running request,
    and the sender's pause -> flush sequence gets 200 at once."""
    client = SyncEngineClient(url)

    async def run():
        async with EngineClient(url) as c:
            long = asyncio.create_task(c.generate(_greedy(PROMPTS[0], 200, ignore_eos=True)))
            await asyncio.to_thread(_wait_for, client, "running", 1)
            await c.request("POST", "/pause_generation", {})
            result = await long
            flushed = await c.flush_cache(timeout=10)
            await c.continue_generation()
            return result, flushed

    result, flushed = asyncio.run(run())
    assert result["meta_info"]["finish_reason"]["type"] == "abort" and "Cache flushed" in flushed


def _hf_routing(model, ids: list[int]) -> torch.Tensor:
    """transformers' own routing of `ids` (one unbatched forward): [len, layers, k] expert ids."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    k = model.config.num_experts_per_tok
    return torch.stack([torch.topk(torch.softmax(r.float(), -1), k, -1).indices for r in out.router_logits], dim=1)


def test_routed_experts_come_back_in_sglangs_encoding(url, hf_model):
    """SGLang's `return_routed_experts`: base64 int32 [seqlen - 1 - start, layers, topk], each row
    the routing of that fed token; a ragged batch (left padding) routes as unbatched transformers,
    and so do requests that share a prompt's prefill row."""
    import base64

    import numpy as np

    cfg = hf_model.config
    client = SyncEngineClient(url)

    async def run():
        async with EngineClient(url) as c:
            await c.pause_generation()
            tasks = [asyncio.create_task(c.generate({**_greedy(p, 6), "return_routed_experts": True,
                                                     "routed_experts_start_len": start}))
                     for p, start in zip(prompts, starts)]
            await asyncio.to_thread(_wait_for, client, "waiting", len(prompts))
            await c.continue_generation()
            return await asyncio.gather(*tasks)

    # the last two repeat the first prompt: they share its prefill row, each gets its own rows
    prompts, starts = PROMPTS[:3] + [PROMPTS[0]] * 2, (0, 0, 2, 0, 1)
    for prompt, start, res in zip(prompts, starts, asyncio.run(run())):
        seq = prompt + res["output_ids"]
        flat = np.frombuffer(base64.b64decode(res["meta_info"]["routed_experts"]), dtype=np.int32)
        got = torch.from_numpy(flat.copy()).view(len(seq) - 1 - start, cfg.num_hidden_layers, cfg.num_experts_per_tok)
        want = _hf_routing(hf_model, seq[:-1])[start:].to(torch.int32)
        assert torch.equal(got.sort(-1).values, want.sort(-1).values)
    plain = client.generate(_greedy(PROMPTS[0], 2))
    assert "routed_experts" not in plain["meta_info"]
