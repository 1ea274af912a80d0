"""Small helpers shared across slime: loading user functions from dotted paths, signature checks.

`load_function` and `SingletonMeta` are part of the slime compatibility surface (`slime.utils.misc`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import threading
from typing import Any, Callable, Iterable


def _split_path(path: str) -> tuple[str, str]:
    """Split "pkg.mod.attr" or "pkg.mod:attr" into (module path, attribute path)."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"expected a dotted path 'pkg.mod.attr', got {path!r}")
    path = path.strip()
    if ":" in path:
        module_path, _, attr_path = path.partition(":")
        if not module_path or not attr_path or ":" in attr_path:
            raise ValueError(f"malformed path {path!r}: expected 'pkg.mod:attr'")
        return module_path, attr_path
    module_path, dot, attr_path = path.rpartition(".")
    if not dot or not module_path or not attr_path:
        raise ValueError(f"malformed path {path!r}: expected 'pkg.mod.attr' (module and attribute)")
    return module_path, attr_path


def import_attr(module_path: str, attr_path: str, *, full_path: str | None = None) -> Any:
    """Import `module_path` and return `attr_path` (which may be dotted, e.g. "Cls.method").

    Raises ModuleNotFoundError when the module itself is missing (an import error raised *inside*
    an existing module propagates unchanged) and AttributeError when the attribute is missing;
    both messages name the full path.
    """
    shown = full_path or f"{module_path}.{attr_path}"
    if not _module_exists(module_path):
        raise ModuleNotFoundError(f"cannot load {shown!r}: module {module_path!r} not found")
    obj: Any = importlib.import_module(module_path)
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise AttributeError(
                f"cannot load {shown!r}: module {module_path!r} exists but has no attribute "
                f"{attr_path!r}"
            )
        obj = getattr(obj, part)
    return obj


def _module_exists(module_path: str) -> bool:
    """Whether `module_path` can be found (imports parent packages, as find_spec must)."""
    try:
        return importlib.util.find_spec(module_path) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def load_function(path: str) -> Callable:
    """Load a callable (or class) from "pkg.mod.attr" or "pkg.mod:attr".

    Raises ValueError for a malformed path, ModuleNotFoundError / AttributeError (naming the path
    and which part is missing) when it cannot be found, TypeError when the target is not callable.
    """
    module_path, attr_path = _split_path(path)
    obj = import_attr(module_path, attr_path, full_path=path)
    if not callable(obj):
        raise TypeError(f"{path!r} resolved to a non-callable {type(obj).__name__}")
    return obj


def accepts_kwarg(fn: Callable, name: str) -> bool:
    """Whether `fn` can be called with keyword `name` (explicitly or through **kwargs)."""
    if declares_param(fn, name):
        return True
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: assume the plain form
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def declares_param(fn: Callable, name: str) -> bool:
    """Whether `fn`'s signature names a parameter `name` (keyword-passable; **kwargs does not count).

    slime's own test for optional plugin arguments (`name in inspect.signature(fn).parameters`):
    a function taking only **kwargs is called without them, as slime calls it.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: assume the plain form
        return False
    return name in params and params[name].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    )


def function_path(fn: Any) -> str:
    """A readable "module.qualname" for error messages about a user function."""
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{name}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (another process may still take it)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_port_block(host: str, count: int, exclude: Iterable[int] = (), attempts: int = 100) -> int:
    """First port of `count` consecutive TCP ports that were all free on `host` a moment ago and
    include none of `exclude` (e.g. a port just picked for something else). Raises RuntimeError
    after `attempts` tries."""
    import socket

    avoid = set(exclude)
    for _ in range(attempts):
        base = free_port(host)
        if base + count > 65536 or avoid & set(range(base, base + count)):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind((host, port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"found no {count} consecutive free ports on {host} in {attempts} tries")


def filter_kwargs_for(fn: Callable, kwargs: dict) -> dict:
    """The subset of `kwargs` that `fn` declares (all of them when it takes **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def decode_int32_meta_array(meta_info: dict, keys) -> list[int] | None:
    """The first of `keys` present in `meta_info`, decoded as a flat list of int32 values.

    SGLang sends such arrays as base64 text; bytes, numpy arrays, tensors and lists are accepted
    too. Returns None when none of the keys is present (or its value is None).
    """
    import base64

    import numpy as np

    for key in [keys] if isinstance(keys, str) else keys:
        value = meta_info.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            value = base64.b64decode(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return np.frombuffer(bytes(value), dtype=np.int32).astype(np.int64).tolist()
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        return np.asarray(value, dtype=np.int64).reshape(-1).tolist()
    return None


class SingletonMeta(type):
    """slime's metaclass for one instance per class: the first call constructs it, later calls
    (whatever their arguments) return that instance. `SingletonMeta.clear(cls)` forgets it."""

    _instances: dict = {}
    _lock = threading.Lock()

    def __call__(cls, *args, **kwargs):
        with SingletonMeta._lock:
            if cls not in SingletonMeta._instances:
                SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
            return SingletonMeta._instances[cls]

    @staticmethod
    def clear(cls) -> None:
        SingletonMeta._instances.pop(cls, None)

    @staticmethod
    def instance(cls):
        """`cls`'s instance, or None when none was constructed (none is made here)."""
        return SingletonMeta._instances.get(cls)
