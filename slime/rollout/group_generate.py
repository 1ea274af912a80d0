"""One sample's and one prompt group's generation, in a rollout context: generate -> sample hooks
-> the teacher's log-probs (on-policy distillation) -> reward.

Every function takes the `RolloutContext` of the call (`slime.rollout.generate_state`) as `ctx`.
slime's signatures, which take `args` and open a context of their own, are the wrappers of
`slime.rollout.sglang_rollout` (`generate`, `generate_and_rm`, `generate_and_rm_group`).
"""

from __future__ import annotations

import asyncio

from slime.rollout.generate_output import apply_generate_output, response_budget
from slime.rollout.group_requests import generate_group, per_sample_reason
from slime.rollout.opd_teacher import fetch_teacher_log_probs, needs_teacher
from slime.rollout.rm_hub import async_rm_each, batched_async_rm
from slime.rollout.router_requests import send_generate
from slime.utils import engine_requests
from slime.utils.misc import load_function
from slime.utils.plugins import call_custom_generate, call_sample_hook
from slime.utils.types import Sample


def sample_seed(args, rollout_id, sample: Sample) -> int:
    """Per-request sampling seed from `--rollout-seed`, the rollout id and the sample index, so a
    resumed run draws the same responses as an uninterrupted one (engines that honour seeds)."""
    return (args.rollout_seed * 1_000_003 + (rollout_id or 0) * 10_007 + (sample.index or 0)) % (2**31)


async def generate(args, sample: Sample, sampling_params: dict, *, ctx) -> Sample:
    """Generate (or, for a partially generated sample, continue) one response via `/generate`
    in the rollout context `ctx`.

    Appends the turn with `sample.append_response_tokens` as slime does (tokens, text, log-probs,
    a loss mask of 1s, the weight version when the engine sends one, the status from SGLang's
    finish reason).
    """
    if not sample.tokens:
        sample.tokens = ctx.prompt_ids(sample.prompt)
    budget = response_budget(args, sample, sampling_params["max_new_tokens"])
    if budget <= 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    payload = engine_requests.generate(sample.tokens, {**sampling_params, "max_new_tokens": budget},
                                       return_logprob=True,
                                       return_routed_experts=getattr(args, "use_rollout_routing_replay", False))
    output = await send_generate(args, await ctx.generate_client(payload), payload)
    return apply_generate_output(args, sample, output, routed_experts=bool(payload.get("return_routed_experts")))


async def generate_and_rm(ctx, sample: Sample, sampling_params: dict, evaluation: bool = False):
    """Generate one sample (custom generate function if set), run sample hooks, fetch the teacher's
    log-probs of each finished train sample (`--use-opd --opd-type sglang`, `opd_teacher.py`), and
    reward it unless `--group-rm` rewards the whole group or the generator already set a reward.

    Returns a list of Samples."""
    args = ctx.args
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
        return [sample]  # finished before an abort sent its group back (--partial-rollout)
    async with ctx.semaphore:
        if ctx.aborted:
            sample.status = Sample.Status.ABORTED
            return [sample]
        custom = load_function(sample.generate_function_path) if sample.generate_function_path else ctx.custom_generate
        if custom:
            samples = await call_custom_generate(custom, args, sample, sampling_params, evaluation)
        else:
            samples = [await generate(args, sample, sampling_params, ctx=ctx)]
    return await _after_generate(ctx, samples, evaluation)


async def _after_generate(ctx, samples: list[Sample], evaluation: bool,
                          reward: bool = True) -> list[Sample]:
    """What follows one sample's generation: sample hooks, the teacher's log-probs, the reward
    (unless `reward` is False: the caller rewards many samples together, `_reward_unscored`)."""
    args = ctx.args
    for i, s in enumerate(samples):
        for hook in ctx.sample_hooks:
            s = await call_sample_hook(hook, args, s, rollout_id=ctx.rollout_id, evaluation=evaluation)
        samples[i] = s
        if needs_teacher(args, s, evaluation):  # on-policy distillation: the teacher scores the response
            await fetch_teacher_log_probs(args, s, ctx.teacher)
    if reward:
        await _reward_unscored(args, samples)
    return samples


async def _reward_unscored(args, samples: list[Sample]) -> None:
    """Each sample's reward (`async_rm`) where it has none and was not aborted; nothing with
    `--group-rm` (the group is rewarded together afterwards)."""
    if args.group_rm:
        return
    todo = [s for s in samples if s.reward is None and s.status != Sample.Status.ABORTED]
    for s, reward in zip(todo, await async_rm_each(args, todo)):
        s.reward = reward


async def _generate_and_rm_batched(ctx, group: list[Sample], params: list[dict],
                                   evaluation: bool) -> list[list[Sample]]:
    """`generate_and_rm` for every sample of `group`, its generation done by one batched request
    (`group_requests.generate_group`): per sample, the same result as the per-sample path."""
    results: list[list[Sample]] = [[s] for s in group]
    todo = [i for i, s in enumerate(group) if s.status not in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)]
    if not todo:  # all finished before an abort sent the group back (--partial-rollout)
        return results
    went = await generate_group(ctx, [group[i] for i in todo], [params[i] for i in todo])
    generated = [i for i, ok in zip(todo, went) if ok]
    after = await asyncio.gather(*(_after_generate(ctx, [group[i]], evaluation, reward=False) for i in generated))
    await _reward_unscored(ctx.args, [s for samples in after for s in samples])  # one thread hop per group
    for i, samples in zip(generated, after):
        results[i] = samples
    return results


async def generate_and_rm_group(ctx, group: list[Sample], sampling_params: dict, evaluation: bool = False) -> list[Sample]:
    """Generate every sample of one prompt group concurrently; `--group-rm` rewards them together.
    With `--rollout-group-requests` the group's generation is one batched request to an engine
    unless `group_requests.per_sample_reason` says why it cannot be."""
    params = [{**sampling_params, "sampling_seed": sample_seed(ctx.args, ctx.rollout_id, s)} for s in group]
    if per_sample_reason(ctx, group) is None:
        results = await _generate_and_rm_batched(ctx, group, params, evaluation)
    else:
        results = await asyncio.gather(*(generate_and_rm(ctx, s, p, evaluation) for s, p in zip(group, params)))
    samples = [s for r in results for s in r]
    if ctx.args.group_rm and not any(s.status == Sample.Status.ABORTED for s in samples):
        rewards = await batched_async_rm(ctx.args, samples)
        for s, r in zip(samples, rewards):
            s.reward = r
    return samples
