"""slime's custom-generate surface: `GenerateState` (one per job, reset after every rollout) and a
multi-turn generate module written against slime's paths, run unchanged through the default
rollout against a local engine behind the router (fixtures of test_sglang_rollout)."""

import asyncio
import copy
import pickle
from types import SimpleNamespace


from slime.rollout import sglang_rollout
from slime.rollout.data_source import RolloutDataSourceWithBuffer
from slime.rollout.generate_state import STATE_ATTR, GenerateState
from slime.rollout.rm_hub import math_dapo_utils
from slime.rollout.sglang_rollout import generate_rollout
from slime.utils.types import Sample
from tests.unit.rollout import slime_style_generate as user
from tests.unit.rollout.test_sglang_rollout import args, router_with_engine  # noqa: F401 fixtures


def bare_args(hf_dir, **over):
    values = dict(hf_checkpoint=str(hf_dir), rollout_num_gpus=4, rollout_num_gpus_per_engine=2,
                  sglang_server_concurrency=3, rollout_temperature=0.7, rollout_top_p=0.9, rollout_top_k=-1,
                  rollout_max_response_len=16, rollout_stop=None, rollout_stop_token_ids=None,
                  rollout_skip_special_tokens=False, sglang_dp_size=2)
    return SimpleNamespace(**{**values, **over})


def test_one_state_per_args_with_slimes_fields(tiny_moe_hf):
    args = bare_args(tiny_moe_hf)
    state = GenerateState(args)
    assert GenerateState(args) is state and GenerateState(bare_args(tiny_moe_hf)) is not state
    assert state.tokenizer("1 mod 2", add_special_tokens=False)["input_ids"]
    assert state.processor is None  # a text model
    assert state.concurrency == 6  # 3 per engine x 4 GPUs / 2 per engine
    assert state.sampling_params["temperature"] == 0.7 and state.sampling_params["max_new_tokens"] == 16
    assert (state.remaining_batch_size, state.pendings, state.aborted) == (0, set(), False)
    with state.dp_rank_context() as first, state.dp_rank_context() as second:
        assert {first, second} == {0, 1} and state.dp_counts == [1, 1]
    assert state.dp_counts == [0, 0]
    state.aborted, state.remaining_batch_size = True, 3
    state.reset()
    assert (state.remaining_batch_size, state.pendings, state.aborted) == (0, set(), False)


def test_copies_of_args_drop_the_state(tiny_moe_hf):
    """Pickled or copied args (a Ray actor, a checkpoint) carry no semaphore or tasks: the copy
    builds its own state."""
    args = bare_args(tiny_moe_hf)
    state = GenerateState(args)
    for copied in (pickle.loads(pickle.dumps(args)), copy.deepcopy(args)):
        assert getattr(copied, STATE_ATTR) is None
        assert GenerateState(copied) is not state


def test_semaphore_is_sized_from_the_engines_and_follows_the_event_loop(tiny_moe_hf):
    state = GenerateState(bare_args(tiny_moe_hf))

    async def grab_all():
        sem = state.semaphore
        for _ in range(state.concurrency):
            await sem.acquire()
        locked = sem.locked()
        for _ in range(state.concurrency):
            sem.release()
        return sem, locked

    first, locked = asyncio.run(grab_all())
    assert locked and state.semaphore is first  # the same object until another loop runs
    second, _ = asyncio.run(grab_all())  # each rollout runs its own loop: no cross-loop error
    assert second is not first


def test_rollout_context_shares_the_jobs_state(args):  # noqa: F811
    ctx = sglang_rollout.RolloutContext.create(args, 0)
    state = GenerateState(args)
    assert ctx.state is state and ctx.tokenizer is state.tokenizer
    ctx.aborted = True  # what _abort_engines does: a custom generate function sees it
    assert state.aborted
    state.reset()


def test_dapo_utils_at_slimes_path():
    assert math_dapo_utils.compute_score("so\nAnswer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert math_dapo_utils.compute_score("Answer: 41", "42")["score"] == -1.0
    long = "Answer: 42" + " pad" * 100  # only the last 300 characters are graded, as in slime
    assert math_dapo_utils.compute_score(long, "42")["acc"] is False
    assert math_dapo_utils.compute_score("Answer: 7 ... \\boxed{42}", "42", strict_box_verify=True)["acc"]
    assert not math_dapo_utils.compute_score("Answer: 42", "42", strict_box_verify=True)["acc"]


def test_slime_style_multi_turn_generate_runs_unchanged(args):  # noqa: F811
    """The module's generate posts two model turns with a tool observation between them; the
    default rollout runs it and rewards with the module's reward."""
    args.custom_generate_function_path = "tests.unit.rollout.slime_style_generate.generate"
    args.custom_rm_path = "tests.unit.rollout.slime_style_generate.reward"
    assert user.load_self() is user.generate
    user.SEEN["states"].clear()
    user.SEEN["remaining"].clear()
    out = generate_rollout(args, 0, RolloutDataSourceWithBuffer(args))
    state = GenerateState(args)
    assert user.SEEN["states"] == {id(state)}  # one state for the whole job
    assert max(user.SEEN["remaining"]) == args.rollout_batch_size  # submitted groups, as in slime
    assert (state.pendings, state.aborted, state.remaining_batch_size) == (set(), False, 0)  # reset
    tokenizer = state.tokenizer
    for group in out.samples:
        for s in group:
            prompt_len = len(tokenizer(s.prompt, add_special_tokens=False)["input_ids"])
            obs = tokenizer(user.calculator(s.prompt), add_special_tokens=False)["input_ids"]
            assert len(s.tokens) == prompt_len + s.response_length
            assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
            first = s.loss_mask.index(0)  # model turn, tool tokens (masked), model turn
            assert 1 <= first <= 2
            assert s.loss_mask == [1] * first + [0] * len(obs) + [1] * (s.response_length - first - len(obs))
            assert s.tokens[prompt_len + first: prompt_len + first + len(obs)] == obs
            assert all(lp == 0.0 for lp in s.rollout_log_probs[first:first + len(obs)])
            assert user.calculator(s.prompt) in s.response
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
            assert s.reward in (1.0, -1.0)


def test_default_generate_appends_as_slime_does(args):  # noqa: F811
    """slime's default generate goes through append_response_tokens: a list loss mask of 1s and the
    engine's weight version as sent (no "None" when an engine sends none)."""
    params = {**sglang_rollout.sampling_params_from_args(args), "max_new_tokens": 2}
    sample = asyncio.run(sglang_rollout.generate(args, Sample(prompt="12 mod 2", index=0), params))
    assert sample.loss_mask == [1] * sample.response_length and sample.response_length >= 1
    assert len(sample.rollout_log_probs) == sample.response_length
    assert sample.weight_versions and "None" not in sample.weight_versions


def test_submit_generate_tasks_as_a_custom_rollout_does(args):  # noqa: F811
    """slime's custom rollout functions submit groups through the state and wait on `pendings`."""
    state = GenerateState(args)
    groups = [[Sample(prompt=f"{n} mod 2", index=2 * g + i, group_index=g, label=str(n % 2)) for i in range(2)]
              for g, n in enumerate((12, 7))]

    async def run():
        state.submit_generate_tasks(groups)
        assert state.remaining_batch_size == 2 and len(state.pendings) == 2
        done, state.pendings = await asyncio.wait(state.pendings)
        return [task.result() for task in done]

    results = asyncio.run(run())
    assert sorted(s.index for group in results for s in group) == [0, 1, 2, 3]
    assert all(s.response_length >= 1 and s.reward in (0, 1) for group in results for s in group)
    state.reset()
