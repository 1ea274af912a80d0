"""The checks of a run's flags that need torch and megatron-core: the machine's refusals
(`slime.utils.arguments.startup_refusals`) and megatron-core's own config objects
(`slime.backends.megatron_utils.config_check`).

`train.py` runs them in a thread while Ray starts in the main thread (`refusals_in_thread`). Not
in a child process: the driver imports torch right after (its placement asks CUDA), so a child
would import it twice, and Ray's own start (five Python processes and the workers it starts
ahead) keeps both cores busy meanwhile (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator


def megatron_configs(args) -> tuple[list[tuple[str, str]], list[str]]:
    """megatron-core's config objects, built as the run builds them (`--dry-run`: as on the GPU):
    (plan rows, refusal lines naming the flags). Imports torch and megatron-core."""
    from slime.backends.megatron_utils.lean_import import import_megatron_core

    import_megatron_core()  # first: megatron-core's own imports, at a third of their cost
    from slime.backends.megatron_utils.config_check import ConfigRefused, check_megatron_configs

    try:
        return check_megatron_configs(args), []
    except ConfigRefused as e:
        return [], [str(e)]


def refusals(args) -> list[str]:
    """The machine's refusals (GPU-only features without CUDA, configurations not implemented),
    else megatron-core's (its config objects refuse the values): one line each."""
    from slime.utils.arguments import startup_refusals

    return startup_refusals(args) or megatron_configs(args)[1]


@contextlib.contextmanager
def refusals_in_thread(args) -> Iterator[Future]:
    """`refusals(args)` in a thread of this process; yields its future."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="startup-checks") as pool:
        yield pool.submit(refusals, args)
