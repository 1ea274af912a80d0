"""The scheduler's continuous batching gives every request HF `generate`'s greedy tokens while
requests of different lengths leave the batch (their slots are refilled by the last rows) and
later ones join; `fill_holes` moves only the rows beyond the new batch size; requests with the same
prompt share its prefill row and each draws what it draws alone."""

import threading

import pytest
import torch

from slime.backends.local_engine.sampling import SamplingParams
from slime.backends.local_engine.scheduler import Request, Scheduler, fill_holes

LENGTHS = [3, 17, 1, 9, 12, 5]


@pytest.mark.parametrize("keep", [[1, 2, 3, 4, 5], [0, 2, 5, 7], [0, 1, 2], [3], [], [4, 6, 7, 9]])
def test_fill_holes_keeps_rows_in_place_and_fills_holes_from_the_end(keep):
    order = fill_holes(keep)
    assert sorted(order) == sorted(keep)
    assert all(order[i] == i for i in keep if i < len(keep))  # rows inside the new size never move
    assert sum(order[i] != i for i in range(len(order))) == sum(i >= len(keep) for i in keep)


def _hf_greedy_ignoring_eos(model, prompt, n):
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.generation_config.eos_token_id = None  # else generate merges the checkpoint's eos back in
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             generation_config=config)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_varied_lengths_and_late_joins_match_hf_greedy(variant, tiny_moe_hf, tiny_dense_hf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_moe_hf if variant == "moe" else tiny_dense_hf
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (int(n),), generator=gen).tolist() for n in torch.randint(2, 12, (8,), generator=gen)]
    lengths = LENGTHS + [4, 8]
    scheduler = Scheduler(model, AutoTokenizer.from_pretrained(path), context_length=256, max_running=16,
                          random_seed=0, weight_version=lambda: "test")
    results, done = {}, threading.Event()

    def submit(i):
        def on_done(result, i=i):
            results[i] = result
            if len(results) == len(prompts):
                done.set()

        params = SamplingParams(max_new_tokens=lengths[i], temperature=0, ignore_eos=True)
        scheduler.submit(Request(rid=str(i), prompt_ids=prompts[i], params=params, on_done=on_done))

    for i in range(len(LENGTHS)):  # one prefill for these: they leave at different steps
        submit(i)
    scheduler.start()
    try:
        for i in range(len(LENGTHS), len(prompts)):  # these join while others run (or after)
            submit(i)
        assert done.wait(120)
    finally:
        scheduler.stop()
    for i, prompt in enumerate(prompts):
        assert results[i]["output_ids"] == _hf_greedy_ignoring_eos(model, prompt, lengths[i]), f"request {i}"


def _serve(model, tokenizer, requests: list[tuple[list[int], SamplingParams]], max_running: int) -> tuple[list[dict], list[int]]:
    """Results of `requests` (all queued before the loop starts) and the rows of every prefill."""
    scheduler = Scheduler(model, tokenizer, context_length=256, max_running=max_running, random_seed=0,
                          weight_version=lambda: "test")
    results, done, rows = {}, threading.Event(), []
    forward = model.forward

    def counting_forward(*args, **kwargs):
        if kwargs.get("use_cache"):  # the prefill (decode steps go through SlotKV's own math)
            rows.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    for i, (prompt, params) in enumerate(requests):
        def on_done(result, i=i):
            results[i] = result
            if len(results) == len(requests):
                done.set()

        scheduler.submit(Request(rid=str(i), prompt_ids=prompt, params=params, on_done=on_done, return_logprob=True))
    model.forward = counting_forward
    scheduler.start()
    try:
        assert done.wait(120)
    finally:
        scheduler.stop()
        del model.forward
    return [results[i] for i in range(len(requests))], rows


def test_requests_with_one_prompt_share_its_prefill_and_draw_what_they_draw_alone(tiny_moe_hf):
    """A group's samples (one prompt, n seeds, some ending at their first token) are prefilled
    as one row each distinct prompt; every request gets the tokens and log-probs it gets served
    alone, and the repeats report their prompt as cached tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_hf, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_moe_hf)
    prompts = [[5, 9, 13, 17], list(range(20, 31))]
    requests = [(prompts[i % 2], SamplingParams(max_new_tokens=1 + (i % 3) * 4, temperature=1.0, sampling_seed=i,
                                                ignore_eos=True)) for i in range(8)]
    together, rows = _serve(model, tokenizer, requests, max_running=8)
    assert rows == [2]  # one prefill, one row per distinct prompt
    alone, _ = _serve(model, tokenizer, requests, max_running=1)
    for i, (shared, single) in enumerate(zip(together, alone)):
        assert shared["output_ids"] == single["output_ids"], f"request {i}"
        got = torch.tensor([e[0] for e in shared["meta_info"]["output_token_logprobs"]])
        want = torch.tensor([e[0] for e in single["meta_info"]["output_token_logprobs"]])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert shared["meta_info"]["cached_tokens"] == (0 if i < 2 else len(prompts[i % 2]))
        assert single["meta_info"]["cached_tokens"] == 0
