"""One batched `/generate` per prompt group, straight to an engine (`--rollout-group-requests`).

Per sample, the default rollout sends one `/generate` through sglang-router: 256 HTTP requests for
32 prompts x 8 samples, whose handling (aiohttp in the rollout, FastAPI in the engine) cost more CPU
than the model's forward in our CPU profile. SGLang's `/generate` takes a batch (`input_ids` a list
of lists, `sampling_params` one dict per prompt) and answers one result per prompt, so a group's
samples can travel in one request, each with its own `sampling_seed` and `max_new_tokens`: the
same tokens are drawn as by separate requests. sglang-router 0.3.2 refuses such a body (422: one
`SamplingParams` per request), so the batch goes to an engine the router lists, round robin per
group (`direct_engines.py`); the router's load balancing is given up for these requests.

Each batched sample ends as the per-sample path leaves it (`generate_output.py`); the caller
(`sglang_rollout.generate_and_rm_group`) then runs the same hooks, teacher and reward per sample.
A batch holds one `--sglang-server-concurrency` permit per sample; `_abort_engines` aborts it like
any request (abort_all on every engine: each prompt of the batch comes back with finish reason
"abort" and what it generated so far); with `--use-fault-tolerance` a batch that failed is re-sent
whole to the next engine listed (none of its output was kept, so nothing is lost or doubled).
"""

from __future__ import annotations

import asyncio

from slime.rollout.direct_engines import DirectEngines
from slime.rollout.generate_output import apply_generate_output, response_budget
from slime.rollout.router_requests import send_with_retries
from slime.utils import engine_requests
from slime.utils.types import Sample


def per_sample_reason(ctx, group: list[Sample]) -> str | None:
    """Why `group` keeps one request per sample; None when it goes as one batched request.

    The batched request does only what the default generation does with `/generate`, so a group
    keeps the per-sample path when:
    - `--rollout-group-requests` is off;
    - its generation is custom (`--custom-generate-function-path`, or a sample's
      `generate_function_path`, e.g. an eval dataset's): that function sends its own requests,
      one sample at a time, and may fan a sample out;
    - `--use-rollout-routing-replay`: its requests ask for routed experts, which the batched path
      does not carry (they already go straight to an engine, one per sample: `direct_engines.py`);
    - the group has one sample (e.g. eval prompts with `n_samples_per_eval_prompt` 1): nothing to
      batch, and the router's kept connections to the engine cost less than the new connection
      each direct request opens (100 one-sample eval groups took 0.1-0.2 s longer direct).
    """
    args = ctx.args
    if not getattr(args, "rollout_group_requests", False):
        return "--rollout-group-requests is off"
    if ctx.custom_generate is not None:
        return "--custom-generate-function-path generates each sample"
    if any(s.generate_function_path for s in group):
        return "a sample's generate_function_path generates it"
    if getattr(args, "use_rollout_routing_replay", False):
        return "--use-rollout-routing-replay asks each request for routed experts"
    if len(group) < 2:
        return "a group of one sample has nothing to batch"
    return None


async def generate_group(ctx, samples: list[Sample], params: list[dict]) -> list[bool]:
    """Generate (or continue) `samples`, unfinished samples of one group, each with its own
    `params` (its seed; `max_new_tokens` is cut to its `response_budget`), in batched `/generate`
    requests to one engine: one request, or chunks of `--sglang-server-concurrency` x engines
    samples when the group is larger than that. Returns per sample whether it went through
    generation; False means the rollout was aborted before its request left: it is marked ABORTED
    and, like a per-sample request that never left, gets no hooks and no reward."""
    limit = ctx.state.concurrency
    starts = range(0, len(samples), limit)
    done = await asyncio.gather(*(_generate_chunk(ctx, samples[i:i + limit], params[i:i + limit]) for i in starts))
    return [went for chunk in done for went in chunk]


async def _generate_chunk(ctx, samples: list[Sample], params: list[dict]) -> list[bool]:
    args = ctx.args
    async with ctx.state.slots(len(samples)):
        if ctx.aborted:
            for sample in samples:
                sample.status = Sample.Status.ABORTED
            return [False] * len(samples)
        todo: list[tuple[Sample, dict]] = []
        for sample, p in zip(samples, params):
            if not sample.tokens:
                sample.tokens = ctx.prompt_ids(sample.prompt)
            budget = response_budget(args, sample, p["max_new_tokens"])
            if budget <= 0:
                sample.status = Sample.Status.TRUNCATED  # at a limit already: nothing to send
            else:
                todo.append((sample, {**p, "max_new_tokens": budget}))
        if todo:
            payload = engine_requests.generate_batch([s.tokens for s, _ in todo], [p for _, p in todo],
                                                     return_logprob=True)
            outputs = await send_batch(args, ctx.direct_engines(), payload)
            if not isinstance(outputs, list) or len(outputs) != len(todo):
                got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
                raise RuntimeError(f"a batched /generate of {len(todo)} prompts was answered with {got} results")
            for (sample, _), output in zip(todo, outputs):
                apply_generate_output(args, sample, output)
    return [True] * len(samples)


async def send_batch(args, engines: DirectEngines, payload: dict) -> list:
    """POST a batched /generate to the next engine. With `--use-fault-tolerance` a retryable
    failure (the engine died, none listed while it restarts, 5xx) re-sends the whole batch to the
    engine listed next, after asking the router for its engines again (`send_with_retries`)."""

    async def send():
        client = await engines.pick()
        return await client.generate(payload)

    return await send_with_retries(args, send, on_retry=engines.forget)
