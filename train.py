"""Synchronous RL training entry point: place -> rollout manager -> actor -> for each rollout:
generate, train, save, sync weights, eval.

`python train.py <flags> --dry-run` parses and validates every flag, prints the resolved plan
(placement, parallel layout, batch arithmetic, memory) and exits without starting Ray.
"""

import logging
import sys

from slime.utils.arguments import parse_args
from slime.utils.plan import build_plan, render_plan


def main(argv=None, entry="train"):
    args = parse_args(argv, entry=entry)
    if args.dry_run:
        print(render_plan(build_plan(args)))
        return 0
    raise SystemExit(
        "train.py: the Ray training loop is not in this build yet (issue: end to end); "
        "run with --dry-run to check flags and print the plan."
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
