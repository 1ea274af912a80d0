"""load_function: dotted and colon paths, errors naming the path and the missing part."""

import pytest

from slime.utils.misc import accepts_kwarg, declares_param, load_function
from slime.utils.types import Sample


def test_dotted_and_colon_paths():
    assert load_function("slime.utils.misc.load_function") is load_function
    assert load_function("slime.utils.misc:load_function") is load_function
    assert load_function("slime.utils.types:Sample.from_dict") == Sample.from_dict


def test_missing_module_is_named():
    with pytest.raises(ModuleNotFoundError, match="'slime.utils.no_such_mod.fn'.*module 'slime.utils.no_such_mod' not found"):
        load_function("slime.utils.no_such_mod.fn")
    with pytest.raises(ModuleNotFoundError, match="module 'nopkg_xyz.mod' not found"):
        load_function("nopkg_xyz.mod.fn")


def test_missing_attribute_is_named():
    with pytest.raises(AttributeError, match="module 'slime.utils.misc' exists but has no attribute 'nope'"):
        load_function("slime.utils.misc.nope")


@pytest.mark.parametrize("path", ["", "justaname", "mod:", ":attr", "a:b:c"])
def test_malformed_paths(path):
    with pytest.raises(ValueError, match="path"):
        load_function(path)


def test_non_callable_target():
    with pytest.raises(TypeError, match="non-callable"):
        load_function("slime.utils.plugins.PLUGIN_FLAGS")


def test_accepts_kwarg():
    def plain(a, b): ...
    def named(a, evaluation=False): ...
    def var(a, **kw): ...
    assert not accepts_kwarg(plain, "evaluation")
    assert accepts_kwarg(named, "evaluation") and accepts_kwarg(var, "evaluation")


def test_declares_param_ignores_var_kwargs():
    def plain(a, b): ...
    def named(a, evaluation=False): ...
    def keyword_only(a, *, evaluation): ...
    def var(a, **evaluation): ...
    assert declares_param(named, "evaluation") and declares_param(keyword_only, "evaluation")
    assert not declares_param(plain, "evaluation") and not declares_param(var, "evaluation")


def test_free_port_block_is_a_whole_free_block_for_sglangs_derived_ports():
    """A multi-node SGLang engine derives ZMQ ports from --dist-init-addr's port (+1 .. +6+dp_rank):
    the block reserved there is 30 + --sglang-dp-size consecutive free ports, never an excluded one."""
    import argparse
    import socket

    from slime.backends.sglang_utils.server_args import dist_init_port_count
    from slime.utils.misc import free_port_block

    assert dist_init_port_count(argparse.Namespace(sglang_dp_size=8)) == 38
    assert dist_init_port_count(argparse.Namespace(sglang_dp_size=None)) == 31
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        for _ in range(5):
            base = free_port_block("127.0.0.1", 38, exclude=(busy - 1,))
            block = range(base, base + 38)
            assert busy not in block and busy - 1 not in block
            for port in block:  # every port of the block can be bound
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
