"""An interrupted torch_dist save (the writer raising half-way: a full disk, a killed writer) leaves
the previous checkpoint loadable, the tracker unchanged and no iteration folder a load could take
for a checkpoint, for in-process and background (`--async-save`) saves on 2 gloo ranks."""

import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn


def _state(rank: int, world: int, value: float) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    tensor = torch.full((4,), value) + rank
    return {"w": ShardedTensor.from_rank_offsets("w", tensor, (0, rank, world)), "iteration": int(value)}


def _failing_writes(after: int):
    """Make torch's item writer raise after `after` items (the file is left half-written)."""
    import torch.distributed.checkpoint.filesystem as fs

    real, count = fs._write_item, [0]

    def write_item(*args, **kwargs):
        count[0] += 1
        if count[0] > after:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    fs._write_item = write_item
    return lambda: setattr(fs, "_write_item", real)


def _interrupted_saves(rank: int, world: int, save: str) -> dict:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from slime.backends.megatron_utils.cpu_compat import apply_cpu_compat
    from slime.backends.megatron_utils.torch_dist import write_torch_dist
    from slime.utils.checkpoint_layout import describe_checkpoint, iteration_dir, read_tracker

    dist.init_process_group("gloo", rank=rank, world_size=world)
    apply_cpu_compat()
    write_torch_dist(_state(rank, world, 1.0), save, 1)
    seen = {}
    for label, iteration, background in (("new", 2, False), ("same", 1, False), ("async", 3, True)):
        restore = _failing_writes(after=0)
        try:
            pending = write_torch_dist(_state(rank, world, 9.0), save, iteration, background=background)
            if background:
                pending.finalize()
            seen[label] = "no error"
        except Exception as err:  # noqa: BLE001 - the test records which error came back
            seen[label] = type(err).__name__
        finally:
            restore()
        dist.barrier()
    loaded = dist_checkpointing.load(_state(rank, world, 0.0), str(iteration_dir(save, read_tracker(save))))
    names = sorted(p.name for p in iteration_dir(save, 1).parent.iterdir() if not p.name.startswith("."))
    tracker, problem = read_tracker(save), describe_checkpoint(save)
    dist.barrier()
    write_torch_dist(_state(rank, world, 2.0), save, 2)  # the next save of an interrupted iteration works
    after = dist_checkpointing.load(_state(rank, world, 0.0), str(iteration_dir(save, read_tracker(save))))
    dist.destroy_process_group()
    return {"errors": seen, "tracker": tracker, "problem": problem,
            "w": loaded["w"].tolist(), "names": names, "after": after["w"].tolist()}


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path):
    results = spawn(_interrupted_saves, 2, tmp_path / "out", save=str(tmp_path / "save"))
    for rank, got in enumerate(results):
        assert got["errors"] == {"new": "OSError", "same": "OSError", "async": "RuntimeError"}
        assert got["tracker"] == 1 and got["problem"] is None
        assert got["w"] == [1.0 + rank] * 4  # the previous checkpoint, intact
        assert got["names"] == ["iter_0000001", "latest_checkpointed_iteration.txt"]
        assert got["after"] == [2.0 + rank] * 4
