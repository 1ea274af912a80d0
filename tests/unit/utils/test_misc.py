"""load_function: dotted and colon paths, errors naming the path and the missing part."""

import pytest

from slime.utils.misc import accepts_kwarg, load_function
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
