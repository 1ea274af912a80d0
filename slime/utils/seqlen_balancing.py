"""Token-balanced partitioning of variable-length samples.

Two uses, both pure and deterministic:
- splitting a global batch across data-parallel ranks (`--balance-data`), keeping the sample
  count per rank equal so every rank runs the same number of optimizer steps;
- packing one rank's samples into micro-batches of at most `--max-tokens-per-gpu` tokens
  (`--use-dynamic-batch-size`), balanced so no micro-batch is much longer than the others.

The heuristic is longest-processing-time first: take samples longest first and give each to the
lightest partition that still has room. It is within 4/3 of the optimal makespan and needs no
search, which is all a micro-batch planner needs.
"""

from __future__ import annotations

import heapq


def balanced_partitions(lengths: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Split sample indices into `k` partitions with near-equal token sums.

    With `equal_size`, every partition gets len(lengths) / k samples (which must divide).
    Returns k lists of indices, each sorted ascending so sample order inside a partition is stable.
    """
    if k <= 0:
        raise ValueError(f"number of partitions must be positive, got {k}")
    if equal_size and len(lengths) % k:
        raise ValueError(f"{len(lengths)} samples cannot be split into {k} equal partitions")
    cap = len(lengths) // k if equal_size else len(lengths)
    heap = [(0, p) for p in range(k)]  # (token sum, partition id): lightest first, ties by id
    parts: list[list[int]] = [[] for _ in range(k)]
    for idx in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        total, p = heapq.heappop(heap)
        parts[p].append(idx)
        if len(parts[p]) < cap:
            heapq.heappush(heap, (total + lengths[idx], p))
    return [sorted(p) for p in parts]


def min_num_microbatches(lengths: list[int], max_tokens: int) -> int:
    """Fewest micro-batches of at most `max_tokens` tokens that hold these samples
    (first-fit decreasing; a sample longer than `max_tokens` gets a micro-batch of its own)."""
    if max_tokens <= 0:
        raise ValueError(f"--max-tokens-per-gpu must be positive, got {max_tokens}")
    bins: list[int] = []
    for length in sorted(lengths, reverse=True):
        for i, used in enumerate(bins):
            if used + length <= max_tokens:
                bins[i] += length
                break
        else:
            bins.append(length)
    return len(bins)


def dynamic_microbatches(lengths: list[int], max_tokens: int, num: int | None = None) -> list[list[int]]:
    """Pack sample indices into micro-batches of about `max_tokens` tokens each.

    `num` is a lower bound on the count (data-parallel ranks agree on the largest count so
    pipeline schedules line up); by default the fewest that fit. Partitions are token-balanced
    and hold at most `max_tokens` tokens unless one sample alone is longer; a partition is empty
    only when there are fewer samples than micro-batches.
    """
    num = max(num or 1, min_num_microbatches(lengths, max_tokens) if lengths else 1)
    while True:
        parts = balanced_partitions(lengths, num, equal_size=False)
        # balancing may overfill a micro-batch that first-fit kept under the limit: add one
        over = [p for p in parts if len(p) > 1 and sum(lengths[i] for i in p) > max_tokens]
        if not over:
            return parts
        num += 1


def split_for_data_parallel(lengths: list[int], dp_size: int, balance: bool) -> list[list[int]]:
    """Indices of the samples each data-parallel rank trains on.

    Without `balance`, rank r takes samples r, r + dp, r + 2 dp, ... (slime's default striding);
    with it, token-balanced partitions of equal size.
    """
    if len(lengths) % dp_size:
        raise ValueError(
            f"{len(lengths)} samples do not split over {dp_size} data-parallel ranks "
            "(--global-batch-size must be a multiple of the data-parallel size)"
        )
    if balance:
        return balanced_partitions(lengths, dp_size, equal_size=True)
    return [list(range(r, len(lengths), dp_size)) for r in range(dp_size)]
