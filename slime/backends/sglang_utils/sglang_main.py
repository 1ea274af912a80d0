"""SGLang's `launch_server` with the job's key taken from the environment, never from argv.

`python -m slime.backends.sglang_utils.sglang_main <sglang flags>` does what `python -m
sglang.launch_server` does (plugins, `prepare_server_args`, `run_server`, then its process tree
ended), with `server_args.api_key` set from `$SLIME_API_KEY` before the server starts. SGLang
(0.5.15.post1 and 0.5.23) reads its key only from `--api-key`, and a command line is readable by
every local user (`/proc/<pid>/cmdline`, `ps`): started this way the key is on none. Refuses a
credential flag on its own command line.
"""

from __future__ import annotations

import os
import sys

from slime.backends.sglang_utils.router_main import refuse_secret_flags
from slime.utils.security import API_KEY_ENV


def keyed_server_args(argv: list[str], environ=os.environ, prepare=None):
    """SGLang's ServerArgs for `argv` (`prepare`: `prepare_server_args` by default), with
    `api_key` from `$SLIME_API_KEY` in `environ` (None when unset: no authentication)."""
    refuse_secret_flags(argv)
    if prepare is None:
        from sglang.srt.server_args import prepare_server_args as prepare
    server_args = prepare(argv)
    server_args.api_key = environ.get(API_KEY_ENV) or None
    return server_args


def main(argv: list[str]) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = keyed_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
