"""sglang-router's launcher with the job's key taken from the environment, never from argv.

`python -m slime.backends.sglang_utils.router_main <sglang-router flags>` parses the flags with
sglang-router's own parser (`sglang_router.launch_router.parse_router_args`), sets the router's
`api_key` from `$SLIME_API_KEY` and starts it in this process (`launch_router`, which blocks).
sglang-router 0.3.2 reads its key only from `--api-key`: a router started with that flag shows
the key in `/proc/<pid>/cmdline` until it renames itself, which any local user can read. Started
this way the key is never on any command line. Refuses `--api-key` on its own command line.

Also sets `cors_allowed_origins` to the router's own address when no origin is given (an empty
list means `access-control-allow-origin: *` in sglang-router), so no web page a user of the node
opens can read the router's answers.
"""

from __future__ import annotations

import os
import sys

from slime.utils.security import API_KEY_ENV, secret_flags_in


def refuse_secret_flags(argv: list[str]) -> None:
    """Exit when `argv` carries a credential flag (the key belongs in `$SLIME_API_KEY`)."""
    found = secret_flags_in(argv)
    if found:
        raise SystemExit(f"{found[0]} on a command line shows the key to every local user; "
                         f"put it in ${API_KEY_ENV} instead")


def keyed_router_args(argv: list[str], environ=os.environ):
    """sglang-router's RouterArgs for `argv`, with `api_key` from `$SLIME_API_KEY` (None when unset)
    and CORS limited to the router's own origin unless `--cors-allowed-origins` is given."""
    from sglang_router.launch_router import parse_router_args

    refuse_secret_flags(argv)
    router_args = parse_router_args(argv)
    router_args.api_key = environ.get(API_KEY_ENV) or None
    if not router_args.cors_allowed_origins:
        router_args.cors_allowed_origins = [f"http://{router_args.host}:{router_args.port}"]
    return router_args


def main(argv: list[str]) -> None:
    from sglang_router.launch_router import launch_router

    launch_router(keyed_router_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
