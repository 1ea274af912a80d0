"""The slime-compatible entry points async_rm / batched_async_rm and the reward-type registry."""

import asyncio
from types import SimpleNamespace

import pytest

from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.rollout.rm_hub.registry import get_reward_fn, known_rm_types
from slime.utils.types import Sample

HELPERS = "tests.unit.rollout.rm_hub.custom_rm_helpers"


def make_args(**overrides):
    fields = dict(rm_type=None, custom_rm_path=None, group_rm=False, rm_url=None, reward_key=None)
    fields.update(overrides)
    return SimpleNamespace(**fields)


def run(coro):
    return asyncio.run(coro)


def test_rm_type_from_args():
    sample = Sample(response=r"So $x = \boxed{\dfrac{3}{4}}$.", label="0.75")
    assert run(async_rm(make_args(rm_type="math"), sample)) == 1.0
    sample = Sample(response=r"So $x = \boxed{0.76}$.", label="0.75")
    assert run(async_rm(make_args(rm_type="math"), sample)) == 0.0


def test_metadata_rm_type_overrides_flag():
    sample = Sample(response="Answer: 36", label="36", metadata={"rm_type": "dapo"})
    reward = run(async_rm(make_args(rm_type="math"), sample))
    assert reward == {"score": 1.0, "acc": True, "pred": "36"}


def test_boxed_prefix_scores_only_the_last_boxed_content():
    args = make_args(rm_type="boxed_f1")
    # Plain f1 would be diluted by the reasoning words; boxed_f1 sees only "Paris".
    sample = Sample(response=r"The capital of France is \boxed{Paris}", label="Paris")
    assert run(async_rm(args, sample)) == pytest.approx(1.0)
    assert run(async_rm(make_args(rm_type="f1"), sample)) < 1.0
    # boxed_deepscaler compares the boxed answer directly (no </think> needed).
    sample = Sample(response=r"\boxed{2\sqrt{2}}", label=r"\sqrt{8}")
    assert run(async_rm(make_args(rm_type="boxed_deepscaler"), sample)) == 1.0
    assert run(async_rm(make_args(rm_type="deepscaler"), sample)) == 0.0


def test_boxed_prefix_without_boxed_scores_as_wrong():
    sample = Sample(response="Answer: 36", label="36")
    assert run(async_rm(make_args(rm_type="boxed_dapo"), sample))["score"] == -1.0
    assert run(async_rm(make_args(rm_type="boxed_math"), sample)) == 0.0


def test_random_is_seeded_by_sample_index():
    args = make_args(rm_type="random")
    rewards = [run(async_rm(args, Sample(response="x", index=i))) for i in range(40)]
    again = [run(async_rm(args, Sample(response="x", index=i))) for i in range(40)]
    assert rewards == again
    assert set(rewards) == {0.0, 1.0}


def test_missing_rm_type_names_the_flags():
    with pytest.raises(ValueError, match="--rm-type.*--custom-rm-path"):
        run(async_rm(make_args(), Sample(response="1", label="1")))


def test_unknown_rm_type_lists_known_ones():
    with pytest.raises(ValueError, match="unknown rm_type 'maths'.*boxed_math"):
        get_reward_fn("maths")
    assert "remote_rm" in known_rm_types() and "boxed_gpqa" in known_rm_types()


def test_local_type_rejects_options():
    with pytest.raises(TypeError, match="takes no options"):
        run(async_rm(make_args(rm_type="math"), Sample(response="1", label="1"), max_attempts=2))


def test_custom_rm_path_and_kwargs():
    sample = Sample(response="abcd", label="ignored")
    assert run(async_rm(make_args(rm_type="math", custom_rm_path=f"{HELPERS}.rm"), sample)) == 4.0
    args = make_args(custom_rm_path=f"{HELPERS}.rm_with_bonus")
    assert run(async_rm(args, sample, bonus=0.5)) == 4.5


def test_per_sample_custom_rm_path():
    sample = Sample(response="abc", label="3", custom_rm_path=f"{HELPERS}.rm")
    assert run(async_rm(make_args(rm_type="math"), sample)) == 3.0


def test_batched_gathers_per_sample_in_order():
    answers = ("2", "3", "2.0", r"\frac{4}{2}")
    samples = [Sample(response=rf"\boxed{{{v}}}", label="2") for v in answers]
    assert run(batched_async_rm(make_args(rm_type="math"), samples)) == [1.0, 0.0, 1.0, 1.0]


def test_group_rm_calls_custom_once_with_the_group():
    samples = [Sample(response=r) for r in ("ccc", "a", "bb")]
    args = make_args(custom_rm_path=f"{HELPERS}.group_rm", group_rm=True)
    assert run(batched_async_rm(args, samples)) == [2.0, 0.0, 1.0]
    # as in slime, a list call hands the custom function the whole list even without --group-rm
    assert run(batched_async_rm(make_args(custom_rm_path=f"{HELPERS}.group_rm"), samples)) == [2.0, 0.0, 1.0]


def test_unknown_type_is_also_slimes_not_implemented_error():
    with pytest.raises(NotImplementedError, match="unknown rm_type"):
        run(async_rm(make_args(rm_type="nope"), Sample(response="x")))
    with pytest.raises(NotImplementedError, match="no reward model"):
        run(async_rm(make_args(), Sample(response="x")))


def test_group_rm_with_builtin_type_scores_each_sample():
    samples = [Sample(response=r"\boxed{2}", label="2"), Sample(response=r"\boxed{3}", label="2")]
    assert run(batched_async_rm(make_args(group_rm=True, rm_type="math"), samples)) == [1.0, 0.0]


def test_group_rm_wrong_length_is_an_error():
    samples = [Sample(response="a"), Sample(response="b")]
    args = make_args(custom_rm_path=f"{HELPERS}.short_group_rm", group_rm=True)
    with pytest.raises(ValueError, match="returned 1 rewards for 2 samples"):
        run(batched_async_rm(args, samples))


def test_sync_custom_rm_is_accepted():
    args = make_args(custom_rm_path=f"{HELPERS}.sync_rm")
    assert run(async_rm(args, Sample(response="abcdef"))) == 6.0


def test_flag_choices_match_the_registry():
    from slime.utils.arguments.rollout import RM_TYPES

    assert sorted(RM_TYPES) == sorted(known_rm_types())


def test_async_rm_each_equals_async_rm_per_sample_with_one_thread_hop(monkeypatch):
    """Local types (math, boxed_f1, dapo by metadata) are scored in one worker thread together;
    custom and random ones go through async_rm; every value equals async_rm's, in order."""
    from slime.rollout import rm_hub

    args = make_args(rm_type="math")
    samples = [Sample(response=r"\boxed{3/4}", label="0.75"), Sample(response="1", label="0"),
               Sample(response="Answer: 36", label="36", metadata={"rm_type": "dapo"}),
               Sample(response=r"It is \boxed{Paris}", label="Paris", metadata={"rm_type": "boxed_f1"}),
               Sample(response="x", label="x", index=3, metadata={"rm_type": "random"}),
               Sample(response="hello", label="hello", custom_rm_path=f"{HELPERS}.rm")]
    want = [run(async_rm(args, s)) for s in samples]
    hops = []
    to_thread = asyncio.to_thread
    monkeypatch.setattr(rm_hub.asyncio, "to_thread", lambda fn, *a: (hops.append(fn), to_thread(fn, *a))[1])
    assert run(rm_hub.async_rm_each(args, samples)) == want
    assert len(hops) == 1
    assert run(batched_async_rm(args, samples)) == want
