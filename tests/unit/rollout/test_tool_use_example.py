"""examples/tool_use: the calculator, and the multi-turn generate function's token bookkeeping
(tool results masked out of the loss, prompt + response = the trajectory) against a scripted
engine and against the local engine behind the router."""

import asyncio
from types import SimpleNamespace

import pytest

from examples.tool_use import generate_with_calculator as example
from slime.rollout.data_source import RolloutDataSourceWithBuffer
from slime.rollout.generate_state import GenerateState
from slime.rollout.sglang_rollout import generate_rollout
from slime.utils.types import Sample
from tests.unit.rollout.test_sglang_rollout import args, router_with_engine  # noqa: F401 fixtures


def test_calculator_is_arithmetic_only():
    assert example.calculator("3 * (4 + 5)") == "27" and example.calculator("7 / 2") == "3.5"
    assert example.calculator("2 ** 10") == "1024" and example.calculator("-3 % 2") == "1"
    assert example.calculator("1 / 0").startswith("error:")
    assert example.calculator("__import__('os')").startswith("error:")
    assert example.calculator("9 ** 999").startswith("error:")
    assert example.calculator("3 *").startswith("error:")


class ScriptedEngine:
    """Answers /generate with the next scripted turn (text, finish reason), recording requests."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.requests = tokenizer, list(turns), []

    async def post(self, url, payload, max_retries=60):
        self.requests.append(payload)
        text, finish = self.turns.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = ids[: payload["sampling_params"]["max_new_tokens"]]
        meta = {"output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(ids)], "finish_reason": finish}
        return {"text": self.tokenizer.decode(ids), "meta_info": meta}


@pytest.fixture
def bare_args(tiny_moe_hf):
    return SimpleNamespace(hf_checkpoint=str(tiny_moe_hf), rollout_num_gpus=1, rollout_num_gpus_per_engine=1,
                           sglang_server_concurrency=2, rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1,
                           rollout_max_response_len=64, rollout_stop=None, rollout_stop_token_ids=None,
                           rollout_skip_special_tokens=False, sglang_router_ip="127.0.0.1", sglang_router_port=1)


def run_scripted(monkeypatch, args, turns, max_new_tokens=64):
    tokenizer = GenerateState(args).tokenizer
    engine = ScriptedEngine(tokenizer, turns)
    monkeypatch.setattr(example, "post", engine.post)
    params = {"max_new_tokens": max_new_tokens, "temperature": 1.0}
    sample = Sample(prompt="What is 3*(4+5)?", label="27", index=0)
    out = asyncio.run(example.generate(args, sample, params))
    return out, engine, tokenizer


def test_tool_result_is_appended_with_loss_mask_zero(bare_args, monkeypatch):
    stop_at_tool = {"type": "stop", "matched": "</calc>"}
    turns = [("<calc>3*(4+5)</calc>", stop_at_tool), ("27<|im_end|>", {"type": "stop", "matched": 2})]
    out, engine, tok = run_scripted(monkeypatch, bare_args, turns)

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    prompt, call = ids(out.prompt), ids("<calc>3*(4+5)</calc>")
    result, answer = ids("<result>27</result>"), ids("27<|im_end|>")
    assert out.tokens == prompt + call + result + answer
    assert out.response_length == len(call) + len(result) + len(answer) == len(out.tokens) - len(prompt)
    assert out.loss_mask == [1] * len(call) + [0] * len(result) + [1] * len(answer)
    assert out.rollout_log_probs[len(call):len(call) + len(result)] == [0.0] * len(result)
    assert out.rollout_log_probs[:len(call)] == [-0.5 - i for i in range(len(call))]
    assert engine.requests[1]["input_ids"] == prompt + call + result  # the model saw the tool's answer
    assert engine.requests[1]["sampling_params"]["max_new_tokens"] == 64 - len(call) - len(result)
    assert "</calc>" in engine.requests[0]["sampling_params"]["stop"]
    assert out.status == Sample.Status.COMPLETED and out.metadata["tool_calls"] == 1
    assert example.final_answer(out.response) == "27" and asyncio.run(example.reward(bare_args, out)) == 1.0


def test_the_budget_covers_tool_tokens(bare_args, monkeypatch):
    """A tool result that does not fit the response budget is cut and the sample is truncated."""
    turns = [("<calc>2**60</calc>", {"type": "stop", "matched": "</calc>"})]
    budget = len("<calc>2**60</calc>") + 5
    out, engine, _ = run_scripted(monkeypatch, bare_args, turns, max_new_tokens=budget)
    assert out.response_length == budget == len(out.loss_mask) == len(out.rollout_log_probs)
    assert out.loss_mask[-5:] == [0] * 5 and out.status == Sample.Status.TRUNCATED
    assert len(engine.requests) == 1


def test_an_answer_without_a_call_is_one_turn(bare_args, monkeypatch):
    out, engine, _ = run_scripted(monkeypatch, bare_args, [("27<|im_end|>", {"type": "stop", "matched": 2})])
    assert out.loss_mask == [1] * out.response_length and len(engine.requests) == 1
    assert out.metadata["tool_calls"] == 0


def test_example_runs_through_the_default_rollout(args):  # noqa: F811
    """Against the local engine (an untrained model rarely calls the tool): every sample's
    trajectory is prompt + response with aligned masks and log-probs, and it is rewarded."""
    args.custom_generate_function_path = "examples.tool_use.generate_with_calculator.generate"
    args.custom_rm_path = "examples.tool_use.generate_with_calculator.reward"
    args.rollout_max_response_len = 8
    out = generate_rollout(args, 0, RolloutDataSourceWithBuffer(args))
    tokenizer = GenerateState(args).tokenizer
    for group in out.samples:
        for s in group:
            prompt_len = len(tokenizer(s.prompt, add_special_tokens=False)["input_ids"])
            assert len(s.tokens) == prompt_len + s.response_length and 1 <= s.response_length <= 8
            assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
            assert s.reward in (0.0, 1.0) and s.metadata["tool_calls"] >= 0
