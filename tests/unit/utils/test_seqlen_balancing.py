"""Token-balanced partitions: equal sizes, every index once, balance, micro-batch limits."""

import random

import pytest

from slime.utils.seqlen_balancing import (
    balanced_partitions,
    dynamic_microbatches,
    min_num_microbatches,
    split_for_data_parallel,
)


def _sums(lengths, parts):
    return [sum(lengths[i] for i in p) for p in parts]


def test_balanced_partitions_hand_example():
    # 10, 9, 8, 7, 1, 1 into 2 equal halves: LPT gives {10, 7, 1} = 18 and {9, 8, 1} = 18.
    lengths = [10, 9, 8, 7, 1, 1]
    parts = balanced_partitions(lengths, 2, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert [len(p) for p in parts] == [3, 3]
    assert _sums(lengths, parts) == [18, 18]


def test_balanced_beats_striding_on_skewed_lengths():
    rng = random.Random(0)
    lengths = sorted(rng.randint(1, 1000) for _ in range(64))
    strided = split_for_data_parallel(lengths, 4, balance=False)
    balanced = split_for_data_parallel(lengths, 4, balance=True)
    assert sorted(i for p in balanced for i in p) == list(range(64))
    assert all(len(p) == 16 for p in balanced)
    spread = lambda parts: max(_sums(lengths, parts)) - min(_sums(lengths, parts))  # noqa: E731
    assert spread(balanced) < spread(strided)
    assert spread(balanced) <= max(lengths)


def test_equal_split_must_divide():
    with pytest.raises(ValueError, match="global-batch-size"):
        split_for_data_parallel([1, 2, 3], 2, balance=True)


def test_min_num_microbatches_first_fit_decreasing():
    # 6, 5, 4, 3, 2 with 8 per bin: [6, 2], [5, 3], [4] -> 3 bins
    assert min_num_microbatches([6, 5, 4, 3, 2], 8) == 3
    # an over-long sample gets a bin of its own instead of failing
    assert min_num_microbatches([20, 1], 8) == 2
    with pytest.raises(ValueError, match="max-tokens-per-gpu"):
        min_num_microbatches([1], 0)


def test_dynamic_microbatches_respects_limit_and_forced_count():
    rng = random.Random(1)
    lengths = [rng.randint(10, 300) for _ in range(40)]
    parts = dynamic_microbatches(lengths, 1024)
    assert sorted(i for p in parts for i in p) == list(range(40))
    assert len(parts) >= sum(lengths) // 1024
    forced = dynamic_microbatches(lengths, 1024, num=len(parts) + 3)
    assert len(forced) == len(parts) + 3
    assert all(forced)


def test_dynamic_microbatches_never_overfill():
    rng = random.Random(2)
    for _ in range(50):
        lengths = [rng.randint(1, 500) for _ in range(rng.randint(1, 30))]
        for part in dynamic_microbatches(lengths, 600):
            assert len(part) == 1 or sum(lengths[i] for i in part) <= 600
