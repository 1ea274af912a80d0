"""Multi-turn tool use with a calculator, written against slime's custom-generate surface.

Use with `--custom-generate-function-path examples.tool_use.generate_with_calculator.generate`
and `--custom-rm-path examples.tool_use.generate_with_calculator.reward` (from the repository root,
`PYTHONPATH=.`). The model may call the tool by writing `<calc>EXPRESSION</calc>`: generation stops
at `</calc>`, the tool's answer `<result>VALUE</result>` is appended to the response as tokens the
loss ignores (loss mask 0, log-prob 0), and the model continues, up to `MAX_TURNS` model turns.
`--rollout-max-response-len` bounds the whole response, tool tokens included, so prompt + response
always fit the trainer's sequence.

The calculator evaluates + - * / // % ** and parentheses on numbers by walking Python's syntax
tree (no `eval`); anything else is answered with an error text the model sees. For tools that run
arbitrary model-written code use `slime.rollout.tools.sandbox.Sandbox` instead.
"""

from __future__ import annotations

import ast
import operator

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

TOOL_OPEN, TOOL_CLOSE = "<calc>", "</calc>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
MAX_TURNS = 4
MAX_EXPONENT = 64  # bounds `**` so one call cannot take long or build a huge integer
_OPERATORS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def _evaluate(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent above {MAX_EXPONENT}")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers, + - * / // % ** and parentheses")


def calculator(expression: str) -> str:
    """The value of an arithmetic expression as text, or "error: ..." (never raises)."""
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError, RecursionError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def tool_call(text: str, finish_reason: dict) -> str | None:
    """The expression of the call a model turn ended with (stopped at `</calc>`), else None."""
    stopped_at_tool = finish_reason.get("matched") == TOOL_CLOSE or text.endswith(TOOL_CLOSE)
    if finish_reason.get("type") != "stop" or not stopped_at_tool or TOOL_OPEN not in text:
        return None
    return text[text.rfind(TOOL_OPEN) + len(TOOL_OPEN):].removesuffix(TOOL_CLOSE)


async def generate(args, sample: Sample, sampling_params) -> Sample:
    """Model turns and calculator results until the model answers without calling the tool."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    budget = sampling_params["max_new_tokens"]
    params = {**sampling_params, "stop": [*(sampling_params.get("stop") or []), TOOL_CLOSE], "no_stop_trim": True}
    if not sample.tokens:
        sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    calls = 0
    for _ in range(MAX_TURNS):
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            break
        payload = {"input_ids": sample.tokens, "return_logprob": True,
                   "sampling_params": {**params, "max_new_tokens": budget - sample.response_length}}
        output = await post(url, payload)
        meta = output["meta_info"]
        pairs = meta["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                      text=output["text"], meta_info=meta)
        expression = tool_call(output["text"], meta["finish_reason"])
        if expression is None:
            break  # an answer, a cut turn or an abort: append_response_tokens set the status
        calls += 1
        result = f"{RESULT_OPEN}{calculator(expression)}{RESULT_CLOSE}"
        ids = state.tokenizer(result, add_special_tokens=False)["input_ids"]
        room = budget - sample.response_length
        kept = ids[:room]
        sample.append_response_tokens(args, tokens=kept, trainable=False,
                                      text=result if kept == ids else state.tokenizer.decode(kept))
        if len(ids) >= room:  # no room left for the model to answer
            sample.status = Sample.Status.TRUNCATED
            break
    else:
        sample.status = Sample.Status.TRUNCATED  # still calling the tool after MAX_TURNS turns
    sample.metadata = {**(sample.metadata or {}), "tool_calls": calls}
    return sample


def final_answer(response: str) -> str:
    """The text the model wrote after its last tool result, end-of-turn token removed."""
    tail = response[response.rfind(RESULT_CLOSE) + len(RESULT_CLOSE):] if RESULT_CLOSE in response else response
    return tail.replace("<|im_end|>", "").strip()


async def reward(args, sample: Sample) -> float:
    """1.0 when the final answer is the label, else 0.0."""
    return float(final_answer(sample.response) == str(sample.label).strip())
