"""Custom reward functions loaded by the tests through --custom-rm-path (dotted paths)."""


async def rm(args, sample):
    """Reward = length of the response, so the test can tell it was called on this sample."""
    return float(len(sample.response))


async def rm_with_bonus(args, sample, bonus=0.0):
    """Shows that async_rm forwards keyword arguments to the custom function."""
    return float(len(sample.response)) + bonus


async def group_rm(args, samples):
    """One call for the whole group: rank of each response length within the group."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].response))
    ranks = [0.0] * len(samples)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


async def short_group_rm(args, samples):
    """A broken group rm that returns one reward too few."""
    return [0.0] * (len(samples) - 1)


def sync_rm(args, sample):
    """A plain (non-async) custom reward function."""
    return float(len(sample.response))


async def nan_rm(args, sample):
    """A broken reward: NaN (e.g. a 0/0 in a score)."""
    return float("nan")


async def group_inf_rm(args, samples):
    """A broken group reward: the second sample's reward is infinite."""
    return [1.0, float("inf")] + [0.0] * (len(samples) - 2)


async def dict_nan_rm(args, sample):
    """A dict reward whose score is NaN."""
    return {"score": float("nan"), "acc": False}
