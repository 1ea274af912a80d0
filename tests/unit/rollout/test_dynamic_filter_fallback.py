"""keep_when_insufficient (slime's DynamicFilterOutput field): dropped groups fill the batch only
when the prompts run out; filter_hub helpers at slime's paths."""

import asyncio
from types import SimpleNamespace

import pytest

from slime.rollout import sglang_rollout
from slime.rollout.filter_hub.base_types import (DynamicFilterOutput, call_dynamic_filter,
                                                 should_drop_dynamic_filter_output)
from slime.utils.types import Sample


class Source:
    def __init__(self, groups):
        self.groups = list(groups)

    def get_samples(self, n):
        out, self.groups = self.groups[:n], self.groups[n:]
        return out


def _group(i, rewards):
    return [Sample(group_index=i, index=i * 10 + j, reward=r) for j, r in enumerate(rewards)]


def _collect(monkeypatch, filter_name, groups, target):
    async def fake_generate(ctx, group, params, evaluation):
        return group

    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", fake_generate)
    args = SimpleNamespace(
        dynamic_sampling_filter_path=f"slime.rollout.filter_hub.dynamic_sampling_filters.{filter_name}",
        rollout_batch_size=target, over_sampling_batch_size=None, partial_rollout=False, reward_key=None,
        rollout_sample_filter_path=None, rollout_all_samples_process_path=None, rollout_temperature=1.0,
        rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=4, rollout_stop=None,
        rollout_stop_token_ids=None, rollout_skip_special_tokens=False)
    # the job's GenerateState as far as the collect loop uses it (pending tasks, submitted groups)
    ctx = SimpleNamespace(args=args, state=SimpleNamespace(pendings=set(), remaining_batch_size=0, aborted=False))
    return asyncio.run(sglang_rollout._collect_groups(ctx, Source(groups)))


def test_fallback_groups_fill_the_batch_only_when_prompts_run_out(monkeypatch):
    groups = [_group(0, [1, 1]), _group(1, [0, 1]), _group(2, [0, 0])]
    kept, metrics = _collect(monkeypatch, "check_reward_nonzero_std_with_fallback", groups, target=2)
    assert [g[0].group_index for g in kept] == [0, 1]  # draw order kept
    with pytest.raises(RuntimeError, match="ran out"):
        _collect(monkeypatch, "check_reward_nonzero_std", [_group(0, [1, 1]), _group(1, [0, 1])], target=2)


def test_filter_hub_helpers():
    out = call_dynamic_filter(lambda args, samples: False, None, [])
    assert isinstance(out, DynamicFilterOutput) and should_drop_dynamic_filter_output(out)
    assert not out.keep_when_insufficient
