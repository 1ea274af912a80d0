"""Write docs/arguments.md, the flag reference, from slime's argument parser.

    python tools/gen_arguments_doc.py [--out docs/arguments.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slime.utils.arguments import DOMAINS, build_parser
from slime.utils.arguments.docgen import domain_checks, render_markdown
from slime.utils.arguments.sglang import PINNED_SGLANG_VERSION, live_server_arg_fields

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "arguments.md"


def main() -> None:
    """Render the reference and write it to --out."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", default=str(DEFAULT_OUT), help="Output markdown path.")
    out = Path(cli.parse_args().out)
    if live_server_arg_fields() is not None:
        raise SystemExit("sglang is installed: the checked-in reference lists the pinned SGLang "
                         f"{PINNED_SGLANG_VERSION}; run this where sglang is not importable")
    out.write_text(render_markdown(build_parser("train"), PINNED_SGLANG_VERSION, domain_checks(DOMAINS)), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
