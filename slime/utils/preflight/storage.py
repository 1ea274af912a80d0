"""`--save` and the run folder are writable, with room for one checkpoint.

The size of one checkpoint is estimated from the plan's parameter count (`slime.utils.plan`):
weights in their training dtype plus, unless `--no-save-optim`, the optimizer state. Under
`--dry-run` a folder that does not exist yet is not checked (a recipe is dry-run away from its
cluster); before a real start each folder is created and a file is written into it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from slime.utils.preflight.report import Report
from slime.utils.run_folder import run_folders


def checkpoint_bytes(args) -> int | None:
    """Estimated bytes of one `--save` checkpoint, or None when the model flags do not say."""
    from slime.utils.plan.memory import precision_from_args
    from slime.utils.plan.model import shape_from_args, total_params

    try:
        params = total_params(shape_from_args(args)).total
        precision = precision_from_args(args)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):  # model flags incomplete (e.g. tests)
        return None
    per_param = precision.weight + (0 if getattr(args, "no_save_optim", False) else precision.optimizer)
    return params * per_param


def _writable(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".slime-write-test-"):
            pass
    except OSError as e:
        return f"{folder}: cannot write there ({e.strerror or e})"
    return None


def check_storage(args, report: Report) -> None:
    """Each run folder writable; `--save` with free space for one checkpoint."""
    need = checkpoint_bytes(args) if getattr(args, "save", None) else None
    for flag, folder in run_folders(args):
        if report.dry_run and not folder.exists():
            continue
        if report.dry_run:
            problem = None if os.access(folder, os.W_OK) else f"{folder}: not writable"
        else:
            problem = _writable(folder)
        if problem:
            report.error(flag, problem, "choose a folder you can write to")
            continue
        if flag == "--save" and need:
            free = shutil.disk_usage(folder).free
            if free < need:
                report.error(flag, f"{folder}: {free / 2**30:.1f} GiB free, one checkpoint needs about "
                             f"{need / 2**30:.1f} GiB (estimated from the model's parameters)",
                             "free space or save elsewhere; --no-save-optim saves weights only")
