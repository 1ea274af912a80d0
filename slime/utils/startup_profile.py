"""Start-up profile: when each stage of a job's start-up ends, in seconds since its command started.

`mark("event")` logs `startup +12.34s event` (INFO) in whatever process of the job it runs: the
driver, the rollout manager, an engine actor, a trainer rank. The clock's zero is
`$SLIME_START_TIME` (epoch seconds; `scripts/run-tiny-moe-cpu.sh` exports it before anything
else, `train.py` sets it when it is unset), which every process of the job inherits. With
`$SLIME_STARTUP_PROFILE` naming a file, each mark is also appended to it as one JSON line
(`{"t": seconds, "event": ..., "pid": ...}`), so a benchmark can read the whole profile.
docs/performance.md ("Start-up") shows a profile and what it led to.
"""

from __future__ import annotations

import json
import logging
import os
import time

START_ENV = "SLIME_START_TIME"
PROFILE_ENV = "SLIME_STARTUP_PROFILE"

logger = logging.getLogger(__name__)


def start_clock() -> None:
    """Set the job's clock zero to now, unless the launching command already set it."""
    os.environ.setdefault(START_ENV, repr(time.time()))


def since_start() -> float | None:
    """Seconds since `$SLIME_START_TIME`, or None when it is unset or not a number."""
    try:
        return time.time() - float(os.environ[START_ENV])
    except (KeyError, ValueError):
        return None


def mark(event: str) -> None:
    """Record that start-up stage `event` just ended (a no-op without a clock)."""
    seconds = since_start()
    if seconds is None:
        return
    logger.info("startup +%.2fs %s", seconds, event)
    path = os.environ.get(PROFILE_ENV)
    if path:
        line = json.dumps({"t": round(seconds, 3), "event": event, "pid": os.getpid()}) + "\n"
        with open(path, "a") as f:  # one short append per mark: lines of several processes stay whole
            f.write(line)
