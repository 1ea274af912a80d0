"""The default rollout: generate -> reward over SGLang's HTTP API, behind sglang-router.

`generate_rollout(args, rollout_id, data_source, evaluation=False)` is the default
`--rollout-function-path`. Train rollouts keep drawing prompt groups (`--over-sampling-batch-size`
at a time) until `--rollout-batch-size` groups pass the dynamic filter, then abort what is still
in flight; with `--partial-rollout` the aborted groups go back to the data source to be continued
later. Eval rollouts run every dataset of `args.eval_datasets` (`--eval-config` or
`--eval-prompt-data`) with its own keys, sampling params and sample count.

The engines may be real SGLang servers or our local engine: both speak the same API, reached
through `slime.utils.engine_client.EngineClient` at `--sglang-router-ip:--sglang-router-port`.
Per-rollout state lives in a `RolloutContext`; what slime keeps per job (tokenizer, semaphore,
abort flag, pending groups) is the job's `GenerateState(args)`, which the context shares and the
rollout resets when it ends (both in `slime.rollout.generate_state`). One sample's and one group's
generation and reward are `slime.rollout.group_generate`'s; this module keeps slime's signatures.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter

from slime.rollout import group_generate
from slime.rollout.group_generate import sample_seed  # noqa: F401 re-exported
from slime.rollout.generate_state import GenerateState, sampling_params_from_args  # noqa: F401 slime's names
from slime.rollout.generate_state import RolloutContext, maybe_load, with_context
from slime.rollout.router_requests import FT_MAX_ATTEMPTS, ROUTER_DEFAULT_REQUEST_TIMEOUT_S, router_client, router_url  # noqa: F401 re-exported
from slime.utils.arguments.eval import eval_datasets
from slime.utils.eval_config import build_eval_dataset_configs
from slime.utils.data import build_samples, load_prompt_rows
from slime.utils.async_utils import run
from slime.utils.engine_client import EngineClient
from slime.utils.misc import load_function
from slime.utils.plugins import call_dynamic_filter
from slime.utils.types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample


async def generate(args, sample: Sample, sampling_params: dict, *, ctx: RolloutContext | None = None) -> Sample:
    """Generate (or, for a partially generated sample, continue) one response via `/generate`
    (`group_generate.generate`). slime-compatible: `generate(args, sample, params)` runs in a
    short-lived context of its own."""
    if ctx is None:  # called directly (slime's signature): a short-lived context of its own
        ctx = RolloutContext.create(args)
        async with ctx:
            return await group_generate.generate(args, sample, sampling_params, ctx=ctx)
    return await group_generate.generate(args, sample, sampling_params, ctx=ctx)


async def generate_and_rm(ctx, sample: Sample, sampling_params: dict, evaluation: bool = False):
    """Generate, hook, score one sample (`group_generate.generate_and_rm`); returns a list of
    Samples. Called as slime does, `generate_and_rm(args, sample, params, evaluation=False)`, it
    runs in a short-lived context and returns a Sample (or the list a custom generator fanned out to)."""
    if not isinstance(ctx, RolloutContext):
        out = await with_context(ctx, group_generate.generate_and_rm, sample, sampling_params, evaluation)
        return out[0] if len(out) == 1 else out
    return await group_generate.generate_and_rm(ctx, sample, sampling_params, evaluation)


async def generate_and_rm_group(ctx, group: list[Sample], sampling_params: dict, evaluation: bool = False) -> list[Sample]:
    """Generate every sample of one prompt group and reward it (`group_generate.generate_and_rm_group`).
    `ctx` may be `args` (slime's signature): a short-lived context is made for the call."""
    if not isinstance(ctx, RolloutContext):
        return await with_context(ctx, group_generate.generate_and_rm_group, group, sampling_params, evaluation)
    return await group_generate.generate_and_rm_group(ctx, group, sampling_params, evaluation)


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
