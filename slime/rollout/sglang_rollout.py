"""The default rollout: generate -> reward over SGLang's HTTP API, behind sglang-router.

`generate_rollout(args, rollout_id, data_source, evaluation=False)` is the default
`--rollout-function-path`. Train rollouts keep drawing prompt groups (`--over-sampling-batch-size`
at a time) until `--rollout-batch-size` groups pass the dynamic filter, then abort what is still
in flight; with `--partial-rollout` the aborted groups go back to the data source to be continued
later. Eval rollouts run every dataset of `args.eval_datasets` (`--eval-config` or
`--eval-prompt-data`) with its own keys, sampling params and sample count.

The engines may be real SGLang servers or our local engine: both speak the same API, reached
through `slime.utils.engine_client.EngineClient` at `--sglang-router-ip:--sglang-router-port`.
Per-rollout state lives in a `RolloutContext` (`slime.rollout.rollout_context`); what slime keeps per job (tokenizer, semaphore,
abort flag, pending groups) is the job's `GenerateState(args)`, which the context shares and the
rollout resets when it ends (`slime.rollout.generate_state`).
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter

from slime.rollout.generate_output import apply_generate_output, response_budget
from slime.rollout.group_requests import generate_group, per_sample_reason
from slime.rollout.opd_teacher import fetch_teacher_log_probs, needs_teacher
from slime.rollout.generate_state import GenerateState, sampling_params_from_args  # noqa: F401 slime's names
from slime.rollout.rm_hub import async_rm_each, batched_async_rm
from slime.rollout.rollout_context import RolloutContext, maybe_load
from slime.rollout.router_requests import send_generate
from slime.rollout.router_requests import FT_MAX_ATTEMPTS, ROUTER_DEFAULT_REQUEST_TIMEOUT_S, router_client, router_url  # noqa: F401 re-exported
from slime.utils.arguments.eval import eval_datasets
from slime.utils.eval_config import build_eval_dataset_configs
from slime.utils.data import build_samples, load_prompt_rows
from slime.utils import engine_requests
from slime.utils.async_utils import run
from slime.utils.engine_client import EngineClient
from slime.utils.misc import load_function
from slime.utils.plugins import (
    call_custom_generate,
    call_dynamic_filter,
    call_sample_hook,
    current_rollout_id,
)
from slime.utils.types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample


def sample_seed(args, rollout_id, sample: Sample) -> int:
    """Per-request sampling seed from `--rollout-seed`, the rollout id and the sample index, so a
    resumed run draws the same responses as an uninterrupted one (engines that honour seeds)."""
    return (args.rollout_seed * 1_000_003 + (rollout_id or 0) * 10_007 + (sample.index or 0)) % (2**31)


async def generate(args, sample: Sample, sampling_params: dict, *, ctx: RolloutContext | None = None) -> Sample:
    """Generate (or, for a partially generated sample, continue) one response via `/generate`.

    Appends the turn with `sample.append_response_tokens` as slime does (tokens, text, log-probs,
    a loss mask of 1s, the weight version when the engine sends one, the status from SGLang's
    finish reason). slime-compatible: `generate(args, sample, params)`.
    """
    if ctx is None:  # called directly (slime's signature): a short-lived context of its own
        ctx = RolloutContext.create(args)
        async with ctx:
            return await generate(args, sample, sampling_params, ctx=ctx)
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

    Returns a list of Samples. Called as slime does, `generate_and_rm(args, sample, params,
    evaluation=False)`, it runs in a short-lived context and returns a Sample (or the list a
    custom generator fanned out to)."""
    if not isinstance(ctx, RolloutContext):
        out = await _with_context(ctx, generate_and_rm, sample, sampling_params, evaluation)
        return out[0] if len(out) == 1 else out
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


async def _after_generate(ctx: RolloutContext, samples: list[Sample], evaluation: bool,
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


async def _generate_and_rm_batched(ctx: RolloutContext, group: list[Sample], params: list[dict],
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
    unless `group_requests.per_sample_reason` says why it cannot be. `ctx` may be `args` (slime's
    signature): a short-lived context is made for the call."""
    if not isinstance(ctx, RolloutContext):
        return await _with_context(ctx, generate_and_rm_group, group, sampling_params, evaluation)
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


async def _with_context(args, fn, *call_args):
    """`fn(ctx, *call_args)` in a context of its own (slime-style calls that pass `args`)."""
    ctx = RolloutContext.create(args, current_rollout_id())
    async with ctx:
        return await fn(ctx, *call_args)


async def _abort_engines(ctx: RolloutContext) -> None:
    """Abort everything in flight on every engine behind the router (`GET /workers` lists them)."""
    ctx.aborted = True
    body = await ctx.client.request("GET", "/workers")
    for worker in body.get("workers", []) if isinstance(body, dict) else body:
        async with EngineClient(worker["url"] if isinstance(worker, dict) else str(worker)) as engine:
            await engine.abort_request(abort_all=True)


async def generate_rollout_async(args, rollout_id: int, data_source) -> tuple[list[list[Sample]], dict]:
    """Collect `--rollout-batch-size` groups that pass the dynamic filter; returns them in the
    order their prompts were drawn, plus rollout metrics."""
    ctx = RolloutContext.create(args, rollout_id)
    try:
        async with ctx:
            return await _collect_groups(ctx, data_source)
    finally:
        ctx.state.reset()  # slime resets after every rollout: the next one starts unaborted


async def _collect_groups(ctx: RolloutContext, data_source) -> tuple[list[list[Sample]], dict]:
    args, state = ctx.args, ctx.state
    params = sampling_params_from_args(args)
    dyn_filter = maybe_load(args.dynamic_sampling_filter_path)
    target, batch = args.rollout_batch_size, args.over_sampling_batch_size or args.rollout_batch_size
    pending: dict[asyncio.Task, int] = {}
    kept: list[tuple[int, list[Sample]]] = []
    dropped: list[tuple[int, list[Sample], bool]] = []
    drops: Counter = Counter()
    order = 0
    while len(kept) < target:
        while len(pending) + len(kept) < target:
            groups = data_source.get_samples(batch)
            if not groups:
                break
            for group in groups:
                task = asyncio.create_task(generate_and_rm_group(ctx, group, params, False))
                pending[task] = order
                state.pendings.add(task)
                order += 1
            state.remaining_batch_size += len(groups)
        if not pending:
            fallback = [(p, g) for p, g, keep_anyway in dropped if keep_anyway][: target - len(kept)]
            if len(kept) + len(fallback) < target:
                raise RuntimeError(f"the data source ran out after {len(kept)} of {target} groups (--rollout-batch-size)")
            kept += fallback  # filtered groups marked keep_when_insufficient fill the batch
            break
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            group, position = task.result(), pending.pop(task)
            state.pendings.discard(task)
            verdict = call_dynamic_filter(dyn_filter, args, group) if dyn_filter else None
            if verdict is None or verdict.keep:
                kept.append((position, group))
            else:
                drops[verdict.reason or "filtered"] += 1
                state.remaining_batch_size -= 1
                dropped.append((position, group, verdict.keep_when_insufficient))
    kept.sort(key=lambda x: x[0])
    # groups that finished beyond the target in the last round are spare, like the aborted ones
    leftovers = await _drain(ctx, pending) + [g for _, g in kept[target:]]
    if args.partial_rollout and leftovers:
        data_source.add_samples(leftovers)
    kept = [g for _, g in kept[:target]]
    used = {id(g) for g in kept}
    _run_after_rollout_plugins(args, kept, kept + [g for _, g, _ in dropped if id(g) not in used], data_source)
    metrics = {f"rollout/dynamic_filter/drop_{k}": float(v) for k, v in drops.items()}
    metrics["rollout/aborted_groups"] = float(len(leftovers))
    return kept, metrics


def _run_after_rollout_plugins(args, kept: list[list[Sample]], finished: list[list[Sample]], data_source) -> None:
    """slime's after-rollout plugins, returns ignored: `--rollout-sample-filter-path` sees the kept
    groups (it may set `remove_sample`); `--rollout-all-samples-process-path` sees every finished
    group, the dynamically filtered ones included, and the data source's `get_samples`."""
    if args.rollout_sample_filter_path:
        load_function(args.rollout_sample_filter_path)(args, kept)
    if args.rollout_all_samples_process_path:
        load_function(args.rollout_all_samples_process_path)(args, finished, data_source.get_samples)


async def _drain(ctx: RolloutContext, pending: dict) -> list[list[Sample]]:
    """Abort and await what is still in flight; returns those groups. Their aborted samples keep
    what they generated so `--partial-rollout` can continue them; finished ones stay finished."""
    if not pending:
        return []
    await _abort_engines(ctx)
    return list(await asyncio.gather(*pending))


def _dataset_configs(args) -> list:
    """`args.eval_datasets` (set at parse time), or built now for hand-made args."""
    configs = getattr(args, "eval_datasets", None)
    if configs is None:
        raw = [{"name": name, "path": path} for name, path in eval_datasets(args)]
        configs = build_eval_dataset_configs(args, raw)
    return configs


async def eval_rollout_async(args, rollout_id: int) -> dict[str, dict]:
    """Generate and reward every eval dataset; returns slime's eval data dict per dataset."""
    ctx = RolloutContext.create(args, rollout_id)
    try:
        async with ctx:
            return {cfg.name: await _eval_dataset(ctx, cfg) for cfg in _dataset_configs(args)}
    finally:
        ctx.state.reset()


def _eval_sampling_params(args, cfg) -> dict:
    """Sampling params of one eval dataset (its config already resolved the flag fallbacks)."""
    params = sampling_params_from_args(args, evaluation=True)
    params.update(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_new_tokens=cfg.max_response_len,
                  stop=cfg.stop, stop_token_ids=cfg.stop_token_ids, skip_special_tokens=cfg.skip_special_tokens)
    extra = {"min_new_tokens": cfg.min_new_tokens, "repetition_penalty": cfg.repetition_penalty,
             "no_stop_trim": cfg.no_stop_trim}
    params.update({k: v for k, v in extra.items() if v is not None})
    return params


async def _eval_dataset(ctx: RolloutContext, cfg) -> dict:
    """One eval dataset: every prompt n times (its config), generated and rewarded."""
    args = ctx.args
    prompts = build_samples(
        load_prompt_rows(cfg.path, input_key=cfg.input_key),
        tokenizer=ctx.tokenizer,
        input_key=cfg.input_key,
        label_key=cfg.label_key,
        metadata_key=cfg.metadata_key,
        tool_key=cfg.tool_key,
        apply_chat_template=bool(cfg.apply_chat_template),
        apply_chat_template_kwargs=cfg.apply_chat_template_kwargs,
        max_prompt_len=args.rollout_max_prompt_len,
        source=cfg.path,
    )
    n = cfg.n_samples_per_eval_prompt or 1
    groups = []
    for i, prompt in enumerate(prompts):
        prompt.metadata = cfg.inject_metadata(prompt.metadata)
        prompt.custom_rm_path = cfg.custom_rm_path
        prompt.generate_function_path = cfg.custom_generate_function_path
        group = [copy.deepcopy(prompt) for _ in range(n)]
        for j, s in enumerate(group):
            s.group_index, s.index = i, i * n + j
        groups.append(group)
    params = _eval_sampling_params(args, cfg)
    done = await asyncio.gather(*(generate_and_rm_group(ctx, g, params, True) for g in groups))
    samples = [s for g in done for s in g]
    return {
        "rewards": [_eval_reward(args, s) for s in samples],
        "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
        "samples": samples,
    }


def _eval_reward(args, sample: Sample) -> float:
    key = getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)
    reward = sample.reward
    return float(reward[key] if key and isinstance(reward, dict) else reward)


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """slime's default `--rollout-function-path` (synchronous; runs on the process's background event loop, `slime.utils.async_utils.run`, as slime does)."""
    if evaluation:
        return RolloutFnEvalOutput(data=run(eval_rollout_async(args, rollout_id)))
    samples, metrics = run(generate_rollout_async(args, rollout_id, data_source))
    return RolloutFnTrainOutput(samples=samples, metrics=metrics)
