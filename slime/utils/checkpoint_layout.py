"""The Megatron-LM checkpoint folder layout as plain files: what a `--load` / `--ref-load` /
`--critic-load` folder must hold, read without megatron or torch (start-up checks import it).

A checkpoint folder holds `latest_checkpointed_iteration.txt` (the tracker: an iteration number,
or `release` as written by slime's and Megatron-LM's converters) and the folder it names:
`iter_{iteration:07d}/`, or `release/`. A torch_dist iteration folder is complete when it holds
megatron's `common.pt`, torch's `.metadata` and megatron's `metadata.json` (written last).

Saves (`torch_dist.write_torch_dist`) write into a staging folder `.saving-iter_XXXXXXX`, rename it
to `iter_XXXXXXX` once every rank finished, and only then replace the tracker (temp file + rename):
an interrupted save leaves the previous checkpoint and tracker as they were, and no folder a load
could take for a checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RELEASE = "release"
COMPLETE_MARKERS = ("common.pt", ".metadata", "metadata.json")
STAGING_PREFIX = ".saving-"
REPLACED_PREFIX = ".replaced-"


def iteration_dir(save_dir, iteration: int | str) -> Path:
    """Megatron-LM's per-iteration folder: `<save>/iter_{iteration:07d}`, or `<save>/release`."""
    name = RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"
    return Path(save_dir) / name


def staging_dir(save_dir, iteration: int) -> Path:
    """Where a save of `iteration` is written before it is renamed into place."""
    return Path(save_dir) / f"{STAGING_PREFIX}{iteration_dir(save_dir, iteration).name}"


def read_tracker(load_dir) -> int | str | None:
    """The tracker's iteration (an int, or `"release"`); None when `load_dir` has no tracker file.
    Raises ValueError naming the file when it holds anything else."""
    tracker = Path(load_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if text == RELEASE:
        return RELEASE
    if not text.isdigit():
        raise ValueError(f"{tracker}: expected an iteration number or 'release', found {text!r}")
    return int(text)


def describe_checkpoint(path) -> str | None:
    """What keeps `path` from being a complete torch_dist checkpoint folder (one phrase, naming
    what is missing), or None when the tracker names a complete iteration folder."""
    path = Path(path)
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a checkpoint folder"
    try:
        iteration = read_tracker(path)
    except ValueError:
        text = (path / TRACKER_FILE).read_text().strip()
        return f"{TRACKER_FILE} holds {text[:40]!r}, not an iteration number or 'release'"
    if iteration is None:
        return f"has no {TRACKER_FILE}{_no_tracker_hint(path)}"
    folder = iteration_dir(path, iteration)
    if not folder.is_dir():
        replaced = path / f"{REPLACED_PREFIX}{folder.name}"
        hint = f" (the previous copy is {replaced.name}: a save replacing it was interrupted)" if replaced.is_dir() else ""
        return f"{TRACKER_FILE} names {folder.name}, which is missing{hint}"
    missing = [name for name in COMPLETE_MARKERS if not (folder / name).is_file()]
    if missing:
        return f"{folder.name} lacks {', '.join(missing)} (a save that did not finish, or not a torch_dist checkpoint)"
    return None


def _no_tracker_hint(path: Path) -> str:
    names = {p.name for p in path.iterdir()}
    if "metadata.json" in names:
        return f": it is an iteration folder; give its parent {path.parent}"
    iterations = sorted(n for n in names if n.startswith("iter_") or n == RELEASE)
    if iterations:
        return f" beside {', '.join(iterations[:3])} (a save that did not finish, or a copy without its tracker)"
    if "config.json" in names or any(n.endswith(".safetensors") for n in names):
        return (": a Hugging Face folder (give it as --hf-checkpoint, or convert it with "
                "tools/convert_hf_to_torch_dist.py)")
    return " (not a Megatron torch_dist checkpoint)"


def holds_checkpoint_files(path) -> bool:
    """Whether `path` holds a tracker or any iteration folder (complete or not)."""
    path = Path(path)
    if not path.is_dir():
        return False
    return any(p.name == TRACKER_FILE or p.name.startswith("iter_") or p.name == RELEASE for p in path.iterdir())


def same_folder(a, b) -> bool:
    """Whether two flag values name the same folder (trailing slashes, `..` and links resolved)."""
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def first_launch(load, save) -> bool:
    """slime's first launch of a recipe: `--load` is the `--save` folder and it holds no
    checkpoint yet (missing, or without a tracker and without iteration folders)."""
    return same_folder(load, save) and not holds_checkpoint_files(load)


def load_problem(flag: str, path, save=None) -> str | None:
    """One-line error for `flag path` (`--load`, `--ref-load`, `--critic-load`), or None when the
    run can use it: a complete checkpoint, or a first launch (`first_launch(path, save)`: the run
    starts fresh, and the caller warns once)."""
    if path is None or first_launch(path, save):
        return None
    problem = describe_checkpoint(path)
    return None if problem is None else f"{flag} {path} {problem}"


# ----- writing (rank 0 of a save) ----------------------------------------------------------------
def write_tracker(save_dir, iteration: int) -> None:
    """Point the tracker at `iteration`: written to a temp file, fsynced, renamed over the old one."""
    tracker = Path(save_dir) / TRACKER_FILE
    tmp = tracker.with_name(f"{STAGING_PREFIX}{TRACKER_FILE}")
    with open(tmp, "w") as stream:
        stream.write(str(iteration))
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(tmp, tracker)
    _fsync_dir(save_dir)


def publish(save_dir, iteration: int) -> Path:
    """Rename the finished staging folder of `iteration` to `iter_XXXXXXX` (a folder already there,
    e.g. a re-run saving the same iteration, is set aside first and removed once the new one is in
    place), then write the tracker. Returns the iteration folder."""
    staging, final = staging_dir(save_dir, iteration), iteration_dir(save_dir, iteration)
    replaced = final.with_name(f"{REPLACED_PREFIX}{final.name}")
    if final.exists():
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(final, replaced)
    os.replace(staging, final)
    _fsync_dir(save_dir)
    write_tracker(save_dir, iteration)
    shutil.rmtree(replaced, ignore_errors=True)
    return final


def prepare_staging(save_dir, iteration: int) -> Path:
    """An empty staging folder for a save of `iteration` (a leftover of an interrupted save of the
    same iteration is removed)."""
    staging = staging_dir(save_dir, iteration)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
