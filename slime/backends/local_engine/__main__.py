"""Entry point: `python -m slime.backends.local_engine --model-path DIR --port N ...` serves one engine."""

from __future__ import annotations

import argparse
import logging
import os

from slime.utils.security import API_KEY_ENV

# Flags that build the access guard, not the engine's config.
GUARD_FLAGS = ("api_key", "allowed_weight_dir", "allowed_group_host")


def parse_args(argv=None):
    """Parse the server flags (names follow SGLang's where they overlap)."""
    p = argparse.ArgumentParser(description="SGLang-compatible local engine (CPU / small GPU)")
    p.add_argument("--model-path", required=True, help="Hugging Face checkpoint folder (config, weights, tokenizer)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port to bind")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weight dtype")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device to run the model on")
    p.add_argument("--max-running-requests", type=int, default=64, help="decode batch size limit")
    p.add_argument("--context-length", type=int, default=None,
                   help="max prompt + output tokens (default: the model's max_position_embeddings)")
    p.add_argument("--random-seed", type=int, default=0, help="seed for requests without sampling_seed")
    p.add_argument("--weight-version", default="default", help="initial weight version reported in meta_info")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's choice; 1 is fastest for tiny models on busy CPUs)")
    p.add_argument("--log-level", default="info", help="logging level")
    p.add_argument("--api-key", default=None,
                   help=f"require `Authorization: Bearer KEY` on every endpoint but /health* (SGLang's flag; "
                        f"default: ${API_KEY_ENV}, preferred since a command line is visible in ps)")
    p.add_argument("--allowed-weight-dir", action="append", default=None, metavar="DIR",
                   help="/update_weights_from_disk loads only from inside these folders (repeatable; "
                        "default: anywhere)")
    p.add_argument("--allowed-group-host", action="append", default=None, metavar="HOST",
                   help="/init_weights_update_group joins only masters at these addresses (repeatable; "
                        "default: any)")
    args = p.parse_args(argv)
    if args.max_running_requests < 1:
        p.error("--max-running-requests must be >= 1")
    if args.context_length is not None and args.context_length < 2:
        p.error("--context-length must be >= 2")
    args.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    return args


def build_guard(args):
    """The access guard of the parsed flags (see `slime.backends.local_engine.guard`)."""
    from slime.backends.local_engine.guard import Guard

    def as_tuple(values):
        return None if values is None else tuple(values)

    return Guard(args.api_key, as_tuple(args.allowed_weight_dir), as_tuple(args.allowed_group_host))


def main(argv=None) -> None:
    """Load the model, start the scheduler, serve HTTP until interrupted."""
    from slime.utils.startup_profile import mark

    mark("local engine: python started")
    import uvicorn

    from slime.backends.local_engine.engine import Engine, EngineConfig
    from slime.backends.local_engine.server import build_app

    mark("local engine: imports done")
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = EngineConfig(**{k: v for k, v in vars(args).items() if k != "log_level" and k not in GUARD_FLAGS})
    engine = Engine(config)
    engine.start()
    mark("local engine: model loaded")
    try:
        uvicorn.run(build_app(engine, build_guard(args)), host=args.host, port=args.port, log_level="warning")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
