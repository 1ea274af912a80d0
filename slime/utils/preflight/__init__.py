"""Pre-flight: every input checked in seconds, before Ray, an engine or a trainer rank starts.

Runs in `--dry-run` and before a real start (`train.py` / `train_async.py` main). `CHECKS` is the
registry: name -> `check(args, report)`; each adds one-line findings (flag, file and line, hint)
to the `Report`. Under `--dry-run` a path that does not exist on this machine is a warning and a
file that exists and is broken is an error; before a real start both are errors.
docs/preflight.md lists the checks and what a user sees for each.
"""

from __future__ import annotations

import logging
from typing import Callable

from slime.utils.preflight.checkpoints import check_checkpoints
from slime.utils.preflight.data import check_eval_data, check_prompt_data
from slime.utils.preflight.plugins import check_plugins
from slime.utils.preflight.ranges import check_ranges
from slime.utils.preflight.report import Finding, Report
from slime.utils.preflight.storage import check_storage
from slime.utils.preflight.template import check_chat_template
from slime.utils.run_folder import rerun_refusal

__all__ = ["CHECKS", "Finding", "Report", "run_preflight"]

logger = logging.getLogger(__name__)


def check_run_folder(args, report: Report) -> None:
    """A folder that holds a run is only resumed (or overwritten with --overwrite-run)."""
    refusal = rerun_refusal(args)
    if refusal is None:
        return
    flag, _, rest = refusal.partition(" ")
    (report.warn if report.dry_run else report.error)(flag, rest)


CHECKS: dict[str, Callable] = {
    "ranges": check_ranges,
    "run_folder": check_run_folder,
    "storage": check_storage,
    "prompt_data": check_prompt_data,
    "eval_data": check_eval_data,
    "chat_template": check_chat_template,
    "checkpoints": check_checkpoints,
    "plugins": check_plugins,
}


def run_preflight(args, checks: dict[str, Callable] | None = None) -> Report:
    """Run every check (`checks`, default `CHECKS`) on `args`; warnings are logged, errors
    returned in the report for the caller to print (one line each) and stop on."""
    report = Report(dry_run=bool(getattr(args, "dry_run", False)))
    for check in (checks or CHECKS).values():
        check(args, report)
    for finding in report.warnings:
        logger.warning("pre-flight: %s", finding.line())
    return report
