"""Safe parser for ``--moe-layer-freq``: an int, or a python-list expression such as ``[1, 1, 0]``,
``[1]*48`` or ``([0]*2 + [1]*46)``, evaluated on its AST (ints, lists, ``*`` and ``+`` only) and
never with ``eval``."""

from __future__ import annotations

import argparse
import ast

_MAX_LEN = 1_000_000


def _value(node: ast.AST, text: str):
    """Evaluate an allowed AST node to an int or a list of ints."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_value(item, text) for item in node.elts]
        if not all(isinstance(item, int) for item in items):
            raise argparse.ArgumentTypeError(f"--moe-layer-freq {text!r}: list items must be ints")
        return items
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
        left, right = _value(node.left, text), _value(node.right, text)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {list, int}:
            seq, times = (left, right) if isinstance(left, list) else (right, left)
            if times < 0 or len(seq) * times > _MAX_LEN:
                raise argparse.ArgumentTypeError(f"--moe-layer-freq {text!r}: bad repeat count {times}")
            return seq * times
    raise argparse.ArgumentTypeError(
        f"--moe-layer-freq {text!r}: expected an int or a list expression like [1,1,0], [1]*48 or "
        f"([0]*2 + [1]*46), got {ast.dump(node)[:60]}")


def parse_moe_layer_freq(text: str) -> int | list[int]:
    """Parse ``--moe-layer-freq``: ``"2"`` -> 2 (every 2nd layer is MoE); ``"[1]*3"`` -> [1, 1, 1].

    Raises argparse.ArgumentTypeError naming the flag on bad syntax or values other than 0/1 in a list.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as error:
        raise argparse.ArgumentTypeError(f"--moe-layer-freq {text!r} is not valid syntax: {error.msg}")
    value = _value(tree.body, text)
    if isinstance(value, list) and any(item not in (0, 1) for item in value):
        raise argparse.ArgumentTypeError(f"--moe-layer-freq {text!r}: list entries must be 0 or 1")
    if isinstance(value, int) and value < 1:
        raise argparse.ArgumentTypeError(f"--moe-layer-freq {text!r}: an int pattern must be >= 1")
    return value
