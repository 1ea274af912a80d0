"""RolloutDataSource(+WithBuffer): groups, epochs with reshuffle, save/load resume, the buffer."""

import json
from types import SimpleNamespace

import pytest

from slime.rollout.data_source import (
    DataSource,
    RolloutDataSource,
    RolloutDataSourceWithBuffer,
    latest_saved_rollout_id,
    state_path,
)
from slime.utils.types import Sample


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"input": f"q{i}", "label": str(i), "metadata": {"i": i}} for i in range(7)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_args(prompt_file, tmp_path, **over):
    base = dict(
        prompt_data=str(prompt_file), input_key="input", label_key="label", metadata_key="metadata",
        tool_key="tools", apply_chat_template=False, apply_chat_template_kwargs="{}",
        rollout_max_prompt_len=None, hf_checkpoint=None, n_samples_per_prompt=2,
        rollout_shuffle=True, rollout_seed=42, save=str(tmp_path / "ckpt"), load=None,
        buffer_filter_path=None,
    )
    base.update(over)
    return SimpleNamespace(**base)


def flat(groups):
    return [(s.prompt, s.group_index, s.index) for g in groups for s in g]


def test_prompt_data_required(tmp_path):
    with pytest.raises(ValueError, match="--prompt-data"):
        RolloutDataSource(make_args(None, tmp_path))


def test_groups_are_deep_copies_with_indices(prompt_file, tmp_path):
    source = RolloutDataSource(make_args(prompt_file, tmp_path, rollout_shuffle=False))
    assert isinstance(source, DataSource) and len(source) == 7
    groups = source.get_samples(2)
    assert flat(groups) == [("q0", 0, 0), ("q0", 0, 1), ("q1", 1, 2), ("q1", 1, 3)]
    a, b = groups[0]
    assert a is not b and a.metadata is not b.metadata and a.label == "0"
    a.metadata["touched"] = True
    assert "touched" not in source.get_samples(7)[-1][0].metadata  # q0 again (epoch 1)


def test_epochs_reshuffle_with_seed_plus_epoch(prompt_file, tmp_path):
    import random

    source = RolloutDataSource(make_args(prompt_file, tmp_path))
    prompts = [g[0].prompt for g in source.get_samples(14)]
    for epoch, chunk in enumerate((prompts[:7], prompts[7:])):
        order = list(range(7))
        random.Random(42 + epoch).shuffle(order)
        assert chunk == [f"q{i}" for i in order]
    assert source.epoch_id == 1 and source.sample_offset == 7


def test_resume_after_save_matches_straight_run(prompt_file, tmp_path):
    straight = RolloutDataSource(make_args(prompt_file, tmp_path, save=None))
    expected = [flat(straight.get_samples(3)) for _ in range(4)]

    first = RolloutDataSource(make_args(prompt_file, tmp_path))
    got = [flat(first.get_samples(3)) for _ in range(2)]  # rollouts 0 and 1
    first.save(1)
    assert state_path(str(tmp_path / "ckpt"), 1).is_file()
    resumed = RolloutDataSource(make_args(prompt_file, tmp_path, load=str(tmp_path / "ckpt")))
    resumed.load(1)
    got.append(flat(resumed.get_samples(3)))  # rollout 2 crosses into epoch 1
    resumed.save(2)
    got.append(flat(resumed.get_samples(3)))
    assert got == expected
    # resuming inside the second epoch needs that epoch's shuffled order restored
    again = RolloutDataSource(make_args(prompt_file, tmp_path, load=str(tmp_path / "ckpt")))
    again.load(2)
    assert again.epoch_id == 1 and flat(again.get_samples(3)) == expected[3]


def test_load_latest_and_fresh_starts(prompt_file, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    source = RolloutDataSource(make_args(prompt_file, tmp_path))
    fresh_order = flat(RolloutDataSource(make_args(prompt_file, tmp_path)).get_samples(2))
    for rollout_id in range(3):
        source.get_samples(2)
        source.save(rollout_id)
    assert latest_saved_rollout_id(ckpt) == 2
    latest = RolloutDataSource(make_args(prompt_file, tmp_path, load=ckpt))
    latest.load()
    assert latest.state_dict() == source.state_dict()
    for load in (None, str(tmp_path / "empty")):
        other = RolloutDataSource(make_args(prompt_file, tmp_path, load=load))
        other.load()
        assert flat(other.get_samples(2)) == fresh_order


def test_save_without_save_dir_writes_nothing(prompt_file, tmp_path):
    RolloutDataSource(make_args(prompt_file, tmp_path, save=None)).save(0)
    assert not (tmp_path / "ckpt").exists()


def test_plain_source_refuses_add_samples(prompt_file, tmp_path):
    with pytest.raises(RuntimeError, match="RolloutDataSourceWithBuffer"):
        RolloutDataSource(make_args(prompt_file, tmp_path)).add_samples([[Sample(), Sample()]])


def test_buffer_served_first_in_first_out(prompt_file, tmp_path):
    source = RolloutDataSourceWithBuffer(make_args(prompt_file, tmp_path, rollout_shuffle=False))
    old = [[Sample(prompt=f"old{i}"), Sample(prompt=f"old{i}")] for i in range(3)]
    source.add_samples(old)
    assert source.get_buffer_length() == 3
    groups = source.get_samples(2)
    assert groups == old[:2] and source.get_buffer_length() == 1
    groups = source.get_samples(3)
    assert groups[0] is old[2] and [g[0].prompt for g in groups[1:]] == ["q0", "q1"]
    with pytest.raises(ValueError, match="--n-samples-per-prompt"):
        source.add_samples([[Sample()]])


def test_buffer_filter_path_plugin(prompt_file, tmp_path):
    args = make_args(
        prompt_file, tmp_path, buffer_filter_path="tests.unit.utils.plugin_fixtures.buffer_filter_newest"
    )
    args.calls = []
    source = RolloutDataSourceWithBuffer(args)
    assert len(source.get_samples(1)) == 1 and args.calls == []  # slime: no filter call on an empty buffer
    old = [[Sample(prompt=f"old{i}"), Sample(prompt=f"old{i}")] for i in range(3)]
    source.add_samples(old)
    assert source.get_samples(1) == [old[2]] and source.buffer == old[:2]
    assert args.calls[0][1] is None and args.calls[0][3] == 1  # slime passes rollout_id=None


def test_chat_template_from_hf_checkpoint(prompt_file, tmp_path, tiny_moe_hf):
    args = make_args(prompt_file, tmp_path, apply_chat_template=True, hf_checkpoint=str(tiny_moe_hf))
    sample = RolloutDataSource(args).get_samples(1)[0][0]
    assert sample.prompt != "q" and "<|im_start|>" in sample.prompt
    with pytest.raises(ValueError, match="--hf-checkpoint"):
        RolloutDataSource(make_args(prompt_file, tmp_path, apply_chat_template=True))
