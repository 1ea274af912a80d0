"""A multi-turn custom generate module written as a slime user writes one (imports at slime's
paths, `GenerateState(args)`, `post` to the router's /generate, `append_response_tokens`), plus a
reward and a custom rollout function. Loaded by tests/unit/rollout/test_generate_state.py through
--custom-generate-function-path / --custom-rm-path; nothing here knows it runs on our package."""

import re

from slime.rollout.rm_hub import batched_async_rm, grade_answer_verl  # noqa: F401 (slime's names)
from slime.rollout.rm_hub.math_dapo_utils import compute_score
from slime.rollout.rm_hub.math_utils import extract_answer
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample

MAX_TURNS = 2
SEEN = {"states": set(), "remaining": []}


def calculator(prompt: str) -> str:
    """The "tool": evaluates the toy prompt ("347 mod 2", chat template or not)."""
    n, m = re.search(r"(\d+) mod (\d+)", prompt).groups()
    return f"\n<tool_response>{int(n) % int(m)}</tool_response>\n"


async def generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    SEEN["states"].add(id(state))
    SEEN["remaining"].append(state.remaining_batch_size)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    for turn in range(MAX_TURNS):
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        payload = {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True}
        output = await post(url, payload)
        meta = output["meta_info"]
        sample.append_response_tokens(
            args,
            tokens=[item[1] for item in meta["output_token_logprobs"]],
            log_probs=[item[0] for item in meta["output_token_logprobs"]],
            text=output["text"],
            meta_info=meta,
        )
        if meta["finish_reason"]["type"] == "abort" or turn == MAX_TURNS - 1:
            break
        observation = calculator(sample.prompt)
        obs_ids = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False, text=observation)
    return sample


async def reward(args, sample: Sample):
    """DAPO score (+1 / -1) of the last character the model wrote."""
    answer = extract_answer(f"\\boxed{{{sample.response.strip()[-1:]}}}")
    return compute_score(f"Answer: {answer}", sample.label)["score"]


def load_self():
    """`misc.load_function` at slime's path resolves this module's generate."""
    return load_function(f"{__name__}.generate")
