"""docs/arguments.md is what tools/gen_arguments_doc.py renders from the current parser."""

from pathlib import Path

import pytest

from slime.utils.arguments import DOMAINS, build_parser
from slime.utils.arguments.docgen import domain_checks, render_markdown
from slime.utils.arguments.sglang import PINNED_SGLANG_VERSION, live_server_arg_fields

DOC = Path(__file__).resolve().parents[4] / "docs" / "arguments.md"


def test_checked_in_doc_is_up_to_date():
    if live_server_arg_fields() is not None:
        pytest.skip("sglang is importable: the parser lists the installed SGLang, the doc the pinned one")
    expected = render_markdown(build_parser(), PINNED_SGLANG_VERSION, domain_checks(DOMAINS))
    assert DOC.read_text(encoding="utf-8") == expected, "run: python tools/gen_arguments_doc.py"


def test_doc_has_a_section_per_domain_and_every_flag():
    text = render_markdown(build_parser(), PINNED_SGLANG_VERSION)
    for section in ("debug", "cluster", "megatron", "data", "rollout", "eval", "algorithm", "checkpoint",
                    "logger", "sglang"):
        assert f"\n## {section}\n" in text
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}`" in text, flag
