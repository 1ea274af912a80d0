"""Run folders: who owns one, and whether a new launch may write into it.

A run folder is `--metrics-dir` (default `runs/latest`: `metrics.jsonl`, tensorboard events) and
`--save` (the Megatron checkpoints). Two rules keep what a run produced:

- **One job per folder.** `RunLock` takes an exclusive `fcntl.flock` on `<folder>/.slime-run.lock`
  for the job's life and writes the holder (PID, host, start time, command) into it. A second
  launch fails at once naming the folder and the holder. The kernel drops the lock when its
  holder dies, so a lock file left by a killed job is taken over with a warning.
- **Re-runs never destroy a run** (`rerun_refusal`). A folder that already holds a run (rows in
  `metrics.jsonl`, a checkpoint tracker in `--save`) is written into only by a resume of it
  (slime's convention: `--load` equal to `--save`; metrics rows are then appended) or with
  `--overwrite-run`, which moves the old `metrics.jsonl` aside (`metrics.jsonl.replaced-<time>`)
  and lets new checkpoints replace the old ones as they are saved. The metrics folder records the
  `--save` of its run (`run.json`); a run saving elsewhere may not append to its metrics (two
  recipes left on the default `runs/latest`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_NAME = ".slime-run.lock"
DEFAULT_METRICS_DIR = "runs/latest"
TRACKER_NAME = "latest_checkpointed_iteration.txt"
RUN_RECORD = "run.json"  # in the metrics folder: the --save of the run whose metrics it holds


class RunFolderError(RuntimeError):
    """A run folder cannot be used by this launch; the message names the folder and the way out."""


def metrics_dir(args) -> Path:
    """The run folder of `args`: `--metrics-dir`, else `runs/latest` under the working directory."""
    return Path(getattr(args, "metrics_dir", None) or DEFAULT_METRICS_DIR)


def run_folders(args) -> list[tuple[str, Path]]:
    """(flag, folder) pairs this job writes a run into: the metrics folder and `--save`."""
    folders = [("--metrics-dir", metrics_dir(args))]
    if getattr(args, "save", None):
        folders.append(("--save", Path(args.save)))
    return folders


def _holder_text(info: dict) -> str:
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    command = str(info.get("command", "?"))
    command = command if len(command) <= 120 else command[:120] + " ..."
    return f"PID {info.get('pid', '?')} on {info.get('host', '?')} since {when} ({command})"


class RunLock:
    """An exclusive lock on each folder of `folders`, held until `release()` (or `with`).

    `acquire()` raises RunFolderError naming the first folder held by another live job, after
    releasing the folders it had already locked."""

    def __init__(self, folders: list[tuple[str, Path]], command: list[str] | None = None):
        self.folders = folders
        self.command = shlex.join(command if command is not None else sys.argv)[:500]
        self._files: list = []

    def acquire(self) -> "RunLock":
        seen = set()
        try:
            for flag, folder in self.folders:
                key = os.path.realpath(folder)
                if key not in seen:
                    seen.add(key)
                    self._files.append(self._lock_one(flag, Path(folder)))
        except BaseException:
            self.release()
            raise
        return self

    def _lock_one(self, flag: str, folder: Path):
        path = folder / LOCK_NAME
        try:
            folder.mkdir(parents=True, exist_ok=True)
            f = open(path, "a+")  # not truncated before the lock is ours: the holder's record stays readable
        except OSError as e:
            raise RunFolderError(f"{flag} {folder}: cannot write there ({e.strerror or e}); choose a folder you "
                                 "can write to") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _read_record(f.read())
            f.close()
            raise RunFolderError(
                f"{flag} {folder} is in use by another job: {_holder_text(holder)}; wait for it to end, "
                f"stop it, or give this run another {flag}") from None
        f.seek(0)
        stale = _read_record(f.read())
        if stale.get("pid"):
            logger.warning("%s %s: taking over the lock left by %s, which is no longer running",
                           flag, folder, _holder_text(stale))
        f.truncate(0)
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                            "command": self.command}) + "\n")
        f.flush()
        return f

    def release(self) -> None:
        """Unlock and close every lock file (the files stay, recording the last holder)."""
        for f in self._files:
            try:
                fcntl.flock(f, fcntl.LOCK_UN)
            finally:
                f.close()
        self._files = []

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_record(text: str) -> dict:
    try:
        record = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def metrics_rows(folder: Path) -> int:
    """Number of non-blank lines of `<folder>/metrics.jsonl` (0 when absent), read by streaming."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def saved_checkpoint(save: Path) -> bool:
    """Whether `--save` already holds a checkpoint (its tracker file).
    CHECKPOINT-HELPER: the lead may swap this for the checkpoint helper's completeness function."""
    return (save / TRACKER_NAME).is_file()


def _same_path(a, b) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def rerun_refusal(args) -> str | None:
    """Why this launch would destroy a run already in its folders, or None when it may go on.

    Allowed: empty folders; a resume (`--load` equal to `--save`); `--load` given with a metrics
    folder that has rows (the rows are appended); `--overwrite-run`."""
    if getattr(args, "overwrite_run", False):
        return None
    ways_out = "give a new folder, or pass --overwrite-run to start afresh in it"
    save = getattr(args, "save", None)
    if save and saved_checkpoint(Path(save)) and not _same_path(args.load, save):
        return (f"--save {save} already holds a checkpoint ({TRACKER_NAME}) of another run: resume it with "
                f"--load {save}, or {ways_out}")
    folder = metrics_dir(args)
    rows = metrics_rows(folder)
    owner = _read_record((folder / RUN_RECORD).read_text() if (folder / RUN_RECORD).is_file() else "").get("save")
    if rows and owner and not _same_path(owner, save):
        return (f"--metrics-dir {folder} holds the metrics of the run saving to {owner} (its {RUN_RECORD}), not "
                f"--save {save}: give this run its own --metrics-dir, or pass --overwrite-run to start afresh in it")
    if rows and not getattr(args, "load", None):
        return (f"--metrics-dir {folder} already holds a run ({rows} rows in metrics.jsonl): resume it with "
                f"--load <its --save>, or {ways_out}")
    return None


def claim_run_folder(args) -> Path | None:
    """Record which run the metrics folder belongs to (`run.json`: its `--save`), and with
    `--overwrite-run` move an existing `metrics.jsonl` to `metrics.jsonl.replaced-<time>` (returned;
    None when nothing was moved) so that the new run starts an empty file."""
    folder = metrics_dir(args)
    record = folder / RUN_RECORD
    if getattr(args, "overwrite_run", False) or not record.is_file():
        save = os.path.realpath(args.save) if getattr(args, "save", None) else None
        record.write_text(json.dumps({"save": save, "started": time.time()}) + "\n")
    path = folder / "metrics.jsonl"
    if not (getattr(args, "overwrite_run", False) and path.is_file()):
        return None
    aside = path.with_name(f"metrics.jsonl.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    path.rename(aside)
    logger.warning("--overwrite-run: the previous %s is kept as %s", path, aside)
    return aside
