"""--sglang-* passthrough: the pinned fallback table, records read from SGLang's own parser, flag
construction and rendering, exclusions, renamed options, and agreement with the installed SGLang
when it can be imported (the conformance tier checks the launch lines against real releases)."""

import argparse
import importlib.util
import json
import sys

import pytest

from slime.utils.arguments import ArgumentError, build_parser, parse_args
from slime.utils.arguments import sglang as sg
from slime.utils.arguments import sglang_fields as sgf

KINDS = {"bool", "int", "float", "str", "list_int", "list_float", "list_str", "json"}
def test_fallback_table_is_pinned_and_well_formed():
    fields = sg.fallback_server_arg_fields()
    names = [f["name"] for f in fields]
    assert len(names) == len(set(names)) > 100
    assert {f["kind"] for f in fields} <= KINDS
    for name in ("mem_fraction_static", "dp_size", "ep_size", "enable_dp_attention", "pp_size", "host"):
        assert name in names
    for name in sg.EXCLUDED_FIELDS:
        assert name in names


def test_passthrough_flags_types_and_defaults(base_argv):
    args = parse_args(base_argv + ["--sglang-mem-fraction-static", "0.6", "--sglang-host", "0.0.0.0",
                                   "--sglang-cuda-graph-bs", "1", "2", "4"])
    assert args.sglang_mem_fraction_static == 0.6 and args.sglang_host == "0.0.0.0"
    assert args.sglang_cuda_graph_bs_decode == [1, 2, 4]  # 0.5.15.post1's spelling of the decode sizes
    assert args.sglang_enable_dp_attention is False and args.sglang_dp_size == 1
    # the pinned 0.5.23 split --cuda-graph-bs: slime's flag lands on the decode graph's sizes
    assert sg.sglang_overrides(args) == {"mem_fraction_static": 0.6, "host": "0.0.0.0",
                                         "cuda_graph_bs_decode": [1, 2, 4]}
    assert sg.engine_tp_size(args) == 1


@pytest.mark.parametrize("flag", ["--sglang-" + name.replace("_", "-") for name in sg.EXCLUDED_FIELDS])
def test_framework_controlled_fields_are_not_passed_through(flag, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([flag, "1"])
    assert flag in capsys.readouterr().err


def test_bool_default_true_gets_a_no_flag():
    parser = argparse.ArgumentParser()
    entry = {"name": "enable_thing", "flag": "--enable-thing", "kind": "bool", "choices": None, "default": True,
             "help": "x"}
    sg.add_passthrough_flag(parser, entry)
    assert parser.parse_args([]).sglang_enable_thing is True
    assert parser.parse_args(["--no-sglang-enable-thing"]).sglang_enable_thing is False


def test_router_flags(base_argv, capsys):
    args = parse_args(base_argv + ["--router-policy", "round_robin", "--router-balance-abs-threshold", "4"])
    assert args.router_policy == "round_robin" and args.router_balance_abs_threshold == 4
    with pytest.raises(SystemExit):
        parse_args(base_argv + ["--router-policy", "nope"])
    assert "--router-policy" in capsys.readouterr().err


def _sglang_like_parser() -> argparse.ArgumentParser:
    """Options declared the ways SGLang's parsers declare them (0.5.15 by hand, 0.5.23 from fields)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", "--model", type=str, required=False, help="The path. More text.")
    parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1, help="TP size")
    parser.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", default=None, help="sizes")
    parser.add_argument("--enable-dp-attention", action="store_true", help="5%% faster")
    parser.add_argument("--monokernel-backend", dest="enable_amd_monokernel", action="store_const", const=True,
                        default=False, help="deprecated spelling")
    parser.add_argument("--enable-amd-monokernel", action="store_true", help="new spelling")
    parser.add_argument("--ports", type=json.loads, default=None, help="json list")
    parser.add_argument("--mode", choices=["a", "b"], default="a", help="mode")
    parser.add_argument("--keep", action=argparse.BooleanOptionalAction, default=True, help="keep")
    parser.add_argument("--config", type=str, help="config file")
    return parser


def test_table_records_from_sglangs_own_parser():
    by_name = {e["name"]: e for e in sgf.entries_from_parser(_sglang_like_parser())}
    assert list(by_name) == ["model_path", "tp_size", "cuda_graph_bs_decode", "enable_dp_attention",
                             "enable_amd_monokernel", "ports", "mode", "keep"]
    assert by_name["model_path"]["help"] == "The path"
    assert (by_name["tp_size"]["flag"], by_name["tp_size"]["kind"], by_name["tp_size"]["default"]) == ("--tp-size", "int", 1)
    assert by_name["cuda_graph_bs_decode"]["kind"] == "list_int"
    assert by_name["enable_dp_attention"]["kind"] == "bool" and "%%" in by_name["enable_dp_attention"]["help"]
    assert by_name["enable_amd_monokernel"]["flag"] == "--enable-amd-monokernel"
    assert by_name["ports"]["kind"] == "json" and by_name["mode"]["choices"] == ["a", "b"]
    assert by_name["keep"] == {**by_name["keep"], "kind": "bool", "default": True}


def test_render_option_spells_values_as_sglang_reads_them():
    by_name = {e["name"]: e for e in sgf.entries_from_parser(_sglang_like_parser())}
    assert sgf.render_option(by_name["enable_dp_attention"], True) == ["--enable-dp-attention"]
    assert sgf.render_option(by_name["enable_dp_attention"], False) == []
    assert sgf.render_option(by_name["cuda_graph_bs_decode"], [1, 2]) == ["--cuda-graph-bs-decode", "1", "2"]
    assert sgf.render_option(by_name["ports"], [5000, 5001]) == ["--ports", "[5000, 5001]"]
    assert sgf.render_option(by_name["ports"], "[1]") == ["--ports", "[1]"]
    assert sgf.render_option(by_name["tp_size"], None) == []


def test_old_spellings_of_other_releases_reach_the_target_name(base_argv):
    """The surface is the union of the supported releases: 0.5.15.post1's aliases of renamed
    options (--cuda-graph-bs, --cuda-graph-max-bs, --nsa-prefill-backend,
    --mamba-scheduler-strategy) set the field 0.5.23 spells --cuda-graph-bs-decode etc."""
    args = parse_args(base_argv + ["--sglang-cuda-graph-bs", "1", "2", "--sglang-cuda-graph-max-bs", "64",
                                   "--sglang-nsa-prefill-backend", "flashmla_sparse",
                                   "--sglang-mamba-scheduler-strategy", "no_buffer"])
    overrides = sg.sglang_overrides(args)
    assert overrides["cuda_graph_bs_decode"] == [1, 2] and overrides["cuda_graph_max_bs_decode"] == 64
    assert overrides["dsa_prefill_backend"] == "flashmla_sparse"
    assert overrides["mamba_radix_cache_strategy"] == "no_buffer"


def test_an_option_the_target_release_lacks_is_refused_naming_it_and_the_release(base_argv):
    only_old = [e for e in sg.union_server_arg_fields() if e["name"] == "torchao_config"]
    assert only_old and only_old[0]["releases"] == ["0.5.15.post1"]
    with pytest.raises(ArgumentError, match=f"--sglang-torchao-config: sglang {sg.PINNED_SGLANG_VERSION} "
                       r"\(the release this job launches\) has no --torchao-config option"):
        parse_args(base_argv + ["--sglang-torchao-config", "int8wo"])


def test_sglang_config_accepts_slimes_top_level_sglang_section(base_argv, tmp_path):
    config = tmp_path / "sglang.yaml"
    config.write_text("sglang:\n  mem-fraction-static: 0.6\n  cuda_graph_max_bs: 32\n")
    args = parse_args(base_argv + ["--sglang-config", str(config)])
    assert args.sglang_mem_fraction_static == 0.6 and args.sglang_cuda_graph_max_bs_decode == 32


def test_live_path_reads_the_installed_parser(tmp_path, monkeypatch):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("a real sglang is installed; test_fallback_matches_installed_sglang covers the live path")
    package = tmp_path / "sglang" / "srt"
    package.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text('__version__ = "9.9.9"\n')
    (package / "__init__.py").write_text("")
    (package / "server_args.py").write_text(
        "class ServerArgs:\n    @staticmethod\n    def add_cli_args(parser):\n"
        "        parser.add_argument('--tp-size', '--tensor-parallel-size', type=int, default=1, help='tp')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sgf._live.cache_clear()
    try:
        live = sgf.live_server_arg_fields()
        assert sgf.server_args_version() == "9.9.9"
    finally:
        sgf._live.cache_clear()
        for name in ("sglang.srt.server_args", "sglang.srt", "sglang"):
            sys.modules.pop(name, None)
    assert live == [{"name": "tp_size", "flag": "--tp-size", "kind": "int", "choices": None, "default": 1,
                     "help": "tp", "aliases": ["--tensor-parallel-size"]}]


def _comparable(fields):
    return {f["name"]: (f["flag"], f["kind"], f["choices"], None if "default_source" in f else f["default"],
                        f.get("aliases"))
            for f in fields}


def test_fallback_matches_installed_sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed; the pinned fallback table is used")
    live = sg.live_server_arg_fields()
    if live is None:
        pytest.skip("sglang.srt.server_args does not import here (missing GPU dependencies)")
    if sg.server_args_version() != sg.PINNED_SGLANG_VERSION:
        pytest.skip(f"installed sglang {sg.server_args_version()} is not the pinned {sg.PINNED_SGLANG_VERSION}")
    assert _comparable(live) == _comparable(sg.fallback_server_arg_fields())


# --- issue 13: SGLang's alias spellings, --sglang-config, --prefill-num-servers -----------------

def test_every_alias_spelling_of_sglang_is_a_passthrough_flag(base_argv):
    """SGLang 0.5.23 spells --ep-size also --expert-parallel-size and --ep: each reaches ep_size."""
    aliases = {f["name"]: f["aliases"] for f in sg.fallback_server_arg_fields()}
    assert aliases["ep_size"] == ["--expert-parallel-size", "--ep"]
    assert aliases["enable_dp_attention"] == []  # a --no-X half of a boolean pair is not an alias
    for flag in ("--sglang-ep-size", "--sglang-expert-parallel-size", "--sglang-ep"):
        args = parse_args(base_argv + ["--rollout-num-gpus-per-engine", "2", flag, "2"])
        assert args.sglang_ep_size == 2 and sg.sglang_overrides(args)["ep_size"] == 2
    parser_flags = build_parser()._option_string_actions
    for entry in sg.passthrough_fields(sg.fallback_server_arg_fields()):
        for alias in entry["aliases"]:
            assert parser_flags["--sglang-" + alias[2:]].dest == "sglang_" + entry["name"], alias


def test_sglang_config_merges_under_the_command_line(base_argv, tmp_path):
    """SGLang's --config precedence: command line > config file > defaults; any spelling as key."""
    config = tmp_path / "sglang.yaml"
    config.write_text("mem-fraction-static: 0.6\nexpert_parallel_size: 2\nenable_eplb: true\n"
                      "cuda_graph_bs_decode: [1, 2]\n")
    argv = base_argv + ["--rollout-num-gpus-per-engine", "2", "--sglang-config", str(config)]
    args = parse_args(argv)
    assert (args.sglang_mem_fraction_static, args.sglang_ep_size, args.sglang_enable_eplb) == (0.6, 2, True)
    assert args.sglang_cuda_graph_bs_decode == [1, 2]
    args = parse_args(argv + ["--sglang-ep-size", "1", "--sglang-mem-fraction-static", "0.5"])
    assert (args.sglang_mem_fraction_static, args.sglang_ep_size) == (0.5, 1)


@pytest.mark.parametrize("text, message", [
    ("no_such_option: 1\n", "'no_such_option' is not an option of any supported sglang release"),
    ("tp_size: 4\n", "'tp_size' is set by slime"),
    ("enable_eplb: 3\n", "enable_eplb must be true or false"),
    ("- a\n", "expected a mapping"),
])
def test_sglang_config_refuses_bad_items_naming_file_and_key(base_argv, tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ArgumentError, match=message) as error:
        parse_args(base_argv + ["--sglang-config", str(config)])
    assert str(config) in str(error.value)


def test_prefill_num_servers_is_validated_then_refused_at_start_up(base_argv):
    from slime.utils.arguments import startup_refusals

    argv = base_argv + ["--prefill-num-servers", "1"]  # 2 GPUs, 1 per engine: 2 engines
    args = parse_args(argv)
    assert startup_refusals(args, cuda_available=True) == [
        "--prefill-num-servers 1: PD disaggregation (prefill and decode engines behind a PD router) is not "
        "implemented; this launcher runs every engine as one mixed pool behind sglang-router, drop the flag"]
    with pytest.raises(ArgumentError, match="leaves no decode engine"):
        parse_args(base_argv + ["--prefill-num-servers", "2"])
