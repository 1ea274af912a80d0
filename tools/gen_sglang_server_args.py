"""Write slime/utils/arguments/sglang_server_args*.json: the options of an SGLang release's
launch_server (name, flag, kind, choices, default, help), read from that release's own parser
(one file per supported release, `RELEASE_FILES`).

SGLang 0.5.23 no longer declares ServerArgs as one dataclass: its fields live in namespace classes
under ``sglang/srt/arg_groups/fields/`` (msgspec Structs, ``A[T, Arg(...)]`` annotations with cli
names, aliases and fields without an option) and ``ServerArgs.add_cli_args`` registers them plus
a few manual and deprecated options. Rather than re-deriving that from the source, this tool
imports the release (pure Python; installed without its GPU dependencies, as the conformance
tier does) and reads the parser ``prepare_server_args`` builds.

    python tests/conformance/releases.py     # installs the releases under ~/.cache/slime/sglang/
    PYTHONPATH=$(python -c "from tests.conformance import releases; import os; \\
        print(os.pathsep.join(releases.pythonpath('0.5.23')))") \\
      python tools/gen_sglang_server_args.py --version 0.5.23
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
from pathlib import Path

from slime.utils.arguments.sglang_fields import RELEASE_FILES, entries_from_parser, sglang_parser

logger = logging.getLogger(__name__)


def read_fields(expected_version: str) -> list[dict]:
    """Options of the importable sglang, which must be `expected_version`."""
    sglang = importlib.import_module("sglang")
    if sglang.__version__ != expected_version:
        raise SystemExit(f"imported sglang {sglang.__version__} from {sglang.__file__}, expected {expected_version}")
    return entries_from_parser(sglang_parser(importlib.import_module("sglang.srt.server_args")))


def main() -> None:
    """Parse the command line, read the release's options and write the JSON table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="SGLang version expected on the import path.")
    parser.add_argument("--out", default=None, help="Output JSON path (default: the release's file of "
                        "RELEASE_FILES in slime/utils/arguments/).")
    cli = parser.parse_args()
    fields = read_fields(cli.version)
    data = {"sglang_version": cli.version, "source": "sglang.srt.server_args.ServerArgs.add_cli_args",
            "fields": fields}
    out = cli.out or RELEASE_FILES.get(cli.version)
    if out is None:
        raise SystemExit(f"sglang {cli.version} is not in RELEASE_FILES ({', '.join(RELEASE_FILES)}): give --out")
    Path(out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    logger.info("wrote %d options of sglang %s to %s", len(fields), cli.version, out)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
