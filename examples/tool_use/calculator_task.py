"""A tool-use task the tiny model learns on CPU: answer "n%3" by asking the calculator.

Used by `examples/tool_use/run-tool-use-cpu.sh` (data: `tools/make_toy_data.py --task mod3`, rows
`{"prompt": "347%3", "label": "2", "metadata": {"question": "347%3", ...}}`). The remainder of a
number up to 999 by 3 depends on all its digits; the tiny model does not learn it in its head
within the run (the no-tool run stays near 1/3), but it can ask the calculator.

Every model turn is one token (`max_new_tokens` 1 per request):
- the first turn is always a call: the model's token opens it, whichever it is;
- after that a digit is the answer and ends the trajectory, and any other token is another call;
- a call appends the calculator's answer to the question (the bare value, `2`) as a token the loss
  ignores (loss mask 0, log-prob 0), and the model takes another turn. At most `MAX_CALLS` calls;
  the turn after them is the answer, whatever it is.
So a trajectory is e.g. `=` `2` `2` (a call, the tool's `2`, the answer) or `?` `2` `a` `2` `2`
(two calls). `--rollout-max-response-len` bounds the whole response, tool tokens included (5 fits
two calls and the answer). Reward: 1.0 for the right answer, else 0.0 (no shaping).

What the model learns is to use what the tool says (and to stop calling); that it calls first is
fixed. Why, from the runs that did not learn (README.md): an untrained model writes a given token
with probability ~1/128 per turn and gains nothing from a call until it has learnt to use the
result. With `=` as the only call and a 0.1 bonus for any call, the policy wrote `=` at every
turn, the answer turn included (GRPO's per-group std normalisation makes a small bonus in an
all-zero group as strong as a right answer); with the bonus only for a call followed by a digit,
it never called. With any non-digit as a call (~92% of the untrained model's turns are calls) it
learnt to answer in the first turn at chance (reward ~0.3 from rollout ~35, call rate near 0)
before it learnt to read the result, in three runs (results `[2]` and `2`, per-sample and
per-token loss), although a plain-torch GRPO simulation of the same task learnt to call and copy
in 40-50 steps with two seeds.

`generate` is the task with the calculator; `generate_without_tool` is the baseline, where the
same calls are answered with `?`.
"""

from __future__ import annotations

from examples.tool_use.generate_with_calculator import calculator
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

MAX_CALLS = 2
NO_ANSWER = "?"  # the baseline tool's reply: one token, like the calculator's digit


def is_call(text: str) -> bool:
    """Whether a one-token model turn asks the calculator (anything but a digit)."""
    return not (len(text) == 1 and text.isdigit())


def calculator_tool(question: str) -> str:
    """The calculator's answer to the question as the model sees it: the bare value ("2")."""
    return calculator(question)


def silent_tool(question: str) -> str:
    """The baseline's tool: the same call, answered with nothing useful (NO_ANSWER)."""
    return NO_ANSWER


async def run_turns(args, sample: Sample, sampling_params, tool, call=is_call) -> Sample:
    """One-token model turns; the first one, and a later one `call` accepts, get `tool(question)`
    appended with loss mask 0; the turn after MAX_CALLS calls, or one `call` refuses, is the answer.

    Sets `sample.metadata["answer"]` (the last model turn's text, None when the response budget
    ran out first) and `["tool_calls"]`. The question is `sample.metadata["question"]`.
    """
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    budget = sampling_params["max_new_tokens"]
    question = (sample.metadata or {}).get("question")
    if question is None:
        raise ValueError(f"sample {sample.index}: no metadata['question'] (make the data with "
                         "tools/make_toy_data.py --task mod3)")
    if not sample.tokens:
        sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    calls, answer = 0, None
    for turn in range(MAX_CALLS + 1):
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            break
        if sample.response_length >= budget:
            sample.status = Sample.Status.TRUNCATED
            break
        payload = {"input_ids": sample.tokens, "return_logprob": True,
                   "sampling_params": {**sampling_params, "max_new_tokens": 1}}
        output = await post(url, payload)
        meta = output["meta_info"]
        pairs = meta["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                      text=output["text"], meta_info=meta)
        if meta["finish_reason"]["type"] == "abort":
            break  # append_response_tokens marked the sample aborted
        if turn == MAX_CALLS or (turn > 0 and not call(output["text"])):
            answer = output["text"]
            sample.status = Sample.Status.COMPLETED  # a one-token answer is a whole turn here
            break
        calls += 1
        ids = state.tokenizer(tool(question), add_special_tokens=False)["input_ids"]
        kept = ids[: budget - sample.response_length]
        if kept:  # the tool's answer, cut to the budget; nothing left means the next check truncates
            sample.append_response_tokens(args, tokens=kept, trainable=False, text=state.tokenizer.decode(kept))
    sample.metadata = {**(sample.metadata or {}), "answer": answer, "tool_calls": calls}
    return sample


async def generate(args, sample: Sample, sampling_params) -> Sample:
    """The task with the calculator (`--custom-generate-function-path`)."""
    return await run_turns(args, sample, sampling_params, calculator_tool)


async def generate_without_tool(args, sample: Sample, sampling_params) -> Sample:
    """The baseline: the same turns, the tool answers nothing."""
    return await run_turns(args, sample, sampling_params, silent_tool)


async def reward(args, sample: Sample) -> float:
    """1.0 when the answer (the last model turn) is the label, else 0.0."""
    answer = (sample.metadata or {}).get("answer")
    return float(answer is not None and answer.strip() == str(sample.label).strip())
