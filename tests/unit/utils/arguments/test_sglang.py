"""--sglang-* passthrough: the pinned fallback table, flag construction, exclusions, the generator
tool, and agreement with the installed SGLang's ServerArgs when it can be imported."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from slime.utils.arguments import build_parser, parse_args
from slime.utils.arguments import sglang as sg

KINDS = {"bool", "int", "float", "str", "list_int", "list_float", "list_str", "json"}
TOOL = Path(__file__).resolve().parents[4] / "tools" / "gen_sglang_server_args.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("gen_sglang_server_args", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fallback_table_is_pinned_and_well_formed():
    fields = sg.fallback_server_arg_fields()
    names = [f["name"] for f in fields]
    assert len(names) == len(set(names)) > 100
    assert {f["kind"] for f in fields} <= KINDS
    for name in ("mem_fraction_static", "dp_size", "ep_size", "enable_dp_attention", "pp_size", "host"):
        assert name in names
    for name in sg.EXCLUDED_FIELDS:
        assert name in names


@pytest.mark.parametrize("annotation,expected", [
    ("bool", ("bool", None)),
    ("Optional[int]", ("int", None)),
    ("Optional[Union[int]]", ("int", None)),
    ("float", ("float", None)),
    ("Optional[List[str]]", ("list_str", None)),
    ("List[int]", ("list_int", None)),
    ("Optional[Dict[str, Any]]", ("json", None)),
    ("Optional[Union[str, Dict]]", ("json", None)),
    ("Literal['a', 'b']", ("str", ["a", "b"])),
    ("Literal[None, 'x']", ("str", ["x"])),
    ("Optional[Callable]", ("json", None)),
    ("A[Optional[int], 'help text']", ("int", None)),
    ("Annotated[List[float], Arg(help='x')]", ("list_float", None)),
])
def test_annotation_kind(annotation, expected):
    assert sg.annotation_kind(annotation) == expected


def test_passthrough_flags_types_and_defaults(base_argv):
    args = parse_args(base_argv + ["--sglang-mem-fraction-static", "0.6", "--sglang-host", "0.0.0.0",
                                   "--sglang-cuda-graph-bs", "1", "2", "4"])
    assert args.sglang_mem_fraction_static == 0.6 and args.sglang_host == "0.0.0.0"
    assert args.sglang_cuda_graph_bs == [1, 2, 4]
    assert args.sglang_enable_dp_attention is False and args.sglang_dp_size == 1
    assert sg.sglang_overrides(args) == {"mem_fraction_static": 0.6, "host": "0.0.0.0", "cuda_graph_bs": [1, 2, 4]}
    assert sg.engine_tp_size(args) == 1


@pytest.mark.parametrize("flag", ["--sglang-" + name.replace("_", "-") for name in sg.EXCLUDED_FIELDS])
def test_framework_controlled_fields_are_not_passed_through(flag, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([flag, "1"])
    assert flag in capsys.readouterr().err


def test_bool_default_true_gets_a_no_flag():
    parser = argparse.ArgumentParser()
    entry = sg.field_entry("enable_thing", "bool", True)
    sg.add_passthrough_flag(parser, entry)
    assert parser.parse_args([]).sglang_enable_thing is True
    assert parser.parse_args(["--no-sglang-enable-thing"]).sglang_enable_thing is False


def test_router_flags(base_argv, capsys):
    args = parse_args(base_argv + ["--router-policy", "round_robin", "--router-balance-abs-threshold", "4"])
    assert args.router_policy == "round_robin" and args.router_balance_abs_threshold == 4
    with pytest.raises(SystemExit):
        parse_args(base_argv + ["--router-policy", "nope"])
    assert "--router-policy" in capsys.readouterr().err


def test_generator_parses_a_server_args_source():
    source = '''
import dataclasses
from typing import List, Optional
@dataclasses.dataclass
class ServerArgs:
    """doc"""
    model_path: str
    tp_size: int = 1
    mem_fraction_static: Optional[float] = None
    cuda_graph_bs: Optional[List[int]] = None
    urls: List[str] = dataclasses.field(default_factory=list)
    capacity: int = 10 * 1000
    mode: str = "auto"
    _private: int = 0
    def method(self):
        x: int = 3
'''
    fields = _load_tool().parse_server_args(source)
    by_name = {f["name"]: f for f in fields}
    assert list(by_name) == ["model_path", "tp_size", "mem_fraction_static", "cuda_graph_bs", "urls",
                             "capacity", "mode"]
    assert by_name["tp_size"]["default"] == 1 and by_name["urls"]["default"] == []
    assert by_name["cuda_graph_bs"]["kind"] == "list_int" and by_name["mem_fraction_static"]["kind"] == "float"
    assert by_name["capacity"]["default_source"] == "10 * 1000" and by_name["capacity"]["default"] is None


SYNTHETIC_SOURCE = '''
from __future__ import annotations
import dataclasses
from typing import List, Literal, Optional
@dataclasses.dataclass
class ServerArgs:
    model_path: str
    mem_fraction_static: Optional[float] = None
    enable_dp_attention: bool = False
    cuda_graph_bs: Optional[List[int]] = None
    urls: List[str] = dataclasses.field(default_factory=list)
    mode: Literal["a", "b"] = "a"
'''


def test_live_path_agrees_with_generator_on_the_same_source(tmp_path, monkeypatch):
    package = tmp_path / "sglang" / "srt"
    package.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "server_args.py").write_text(SYNTHETIC_SOURCE)
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("a real sglang is installed; test_fallback_matches_installed_sglang covers the live path")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        live = sg.live_server_arg_fields()
    finally:
        for name in ("sglang.srt.server_args", "sglang.srt", "sglang"):
            sys.modules.pop(name, None)
    assert live == _load_tool().parse_server_args(SYNTHETIC_SOURCE)
    assert [f["name"] for f in live][:2] == ["model_path", "mem_fraction_static"]


def _comparable(fields):
    return {f["name"]: (f["kind"], f["choices"], None if "default_source" in f else f["default"]) for f in fields}


def test_fallback_matches_installed_sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed; the pinned fallback table is used")
    from importlib.metadata import version

    if version("sglang") != sg.PINNED_SGLANG_VERSION:
        pytest.skip(f"installed sglang {version('sglang')} is not the pinned {sg.PINNED_SGLANG_VERSION}")
    live = sg.live_server_arg_fields()
    if live is None:
        pytest.skip("sglang.srt.server_args does not import here (missing GPU dependencies)")
    pinned = _comparable(sg.fallback_server_arg_fields())
    for name, (kind, choices, default) in _comparable(live).items():
        assert name in pinned, name
        assert pinned[name][:2] == (kind, choices), name
        if pinned[name][2] is not None and default is not None:
            assert pinned[name][2] == default, name
    assert set(pinned) == set(_comparable(live))
