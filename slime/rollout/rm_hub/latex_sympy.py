"""Safe LaTeX-ish answer -> sympy expression conversion and bounded symbolic equality.

Owns `parse_latex_expr` and `sympy_equal`, used by the math graders (`math_utils.is_equiv`).

Nothing here calls `eval`: a LaTeX-ish answer is first rewritten into a small plain grammar
(`\\frac{a}{b}` -> `((a)/(b))`, `\\sqrt{x}` -> `sqrt(x)`, braces -> parentheses, ...), then
tokenised against a whitelist and parsed by a recursive-descent parser that builds sympy objects
directly. Inputs are bounded (characters, tokens, number digits, numeric exponents), so a hostile
answer such as `9^9^9^9` is rejected instead of hanging the rollout.
"""

from __future__ import annotations

import re
from types import MappingProxyType

import sympy

MAX_EXPR_CHARS = 200
MAX_TOKENS = 120
MAX_NUMBER_DIGITS = 64
MAX_NUMERIC_EXPONENT = 64
MAX_POWER_BITS = 4096
REL_TOL = 1e-9

_FUNCTIONS = MappingProxyType(
    {
        "sqrt": sympy.sqrt,
        "sin": sympy.sin,
        "cos": sympy.cos,
        "tan": sympy.tan,
        "ln": sympy.log,
        "log": sympy.log,
        "exp": sympy.exp,
    }
)
_CONSTANTS = MappingProxyType({"pi": sympy.pi, "oo": sympy.oo})
# LaTeX commands that map 1:1 to a plain token (with spaces so neighbours stay separate tokens).
_COMMAND_TOKENS = MappingProxyType(
    {
        "cdot": " * ",
        "times": " * ",
        "ast": " * ",
        "div": " / ",
        "pi": " pi ",
        "infty": " oo ",
        **{name: f" {name} " for name in ("sin", "cos", "tan", "ln", "log", "exp")},
    }
)
_TOKEN_RE = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|([a-zA-Z]+)|([-+*/^()]))")


class LatexParseError(ValueError):
    """The answer is outside the small grammar this module understands."""


def _read_group(s: str, i: int) -> tuple[str, int]:
    """Read one LaTeX argument at s[i]: a balanced `{...}` group or a single character.

    Returns (content, index after the argument).
    """
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise LatexParseError("missing argument")
    if s[i] != "{":
        if s[i] == "\\":
            raise LatexParseError("command as a brace-less argument")
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    raise LatexParseError("unbalanced braces")


def _read_optional(s: str, i: int) -> tuple[str | None, int]:
    """Read an optional `[...]` argument (no nesting) at s[i]."""
    if i < len(s) and s[i] == "[":
        end = s.find("]", i)
        if end < 0:
            raise LatexParseError("unclosed [")
        return s[i + 1 : end], end + 1
    return None, i


def _convert_command(s: str, i: int) -> tuple[str, int]:
    """Convert the LaTeX command starting at s[i] == '\\'; returns (plain text, next index)."""
    match = re.match(r"\\([a-zA-Z]+)", s[i:])
    if not match:
        raise LatexParseError(f"unsupported LaTeX escape near {s[i:i + 8]!r}")
    name, i = match.group(1), i + match.end()
    if name in ("frac", "dfrac", "tfrac"):
        num, i = _read_group(s, i)
        den, i = _read_group(s, i)
        return f"(({to_plain(num)})/({to_plain(den)}))", i
    if name == "sqrt":
        index, i = _read_optional(s, i)
        arg, i = _read_group(s, i)
        if index is None:
            return f" sqrt({to_plain(arg)}) ", i
        return f"(({to_plain(arg)})^(1/({to_plain(index)})))", i
    if name in _COMMAND_TOKENS:
        return _COMMAND_TOKENS[name], i
    raise LatexParseError(f"unsupported LaTeX command \\{name}")


def to_plain(s: str) -> str:
    """Rewrite a LaTeX-ish expression into the plain grammar parsed by `parse_plain`.

    Raises LatexParseError for commands outside the supported set.
    """
    out, i = [], 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            text, i = _convert_command(s, i)
            out.append(text)
            continue
        out.append({"{": "(", "}": ")"}.get(ch, ch))
        i += 1
    return "".join(out)


def _tokenize(s: str) -> list[tuple[str, str]]:
    """Split plain text into (kind, text) tokens; kind is 'num', 'name' or 'op'."""
    tokens, pos = [], 0
    s = s.rstrip()
    while pos < len(s):
        match = _TOKEN_RE.match(s, pos)
        if not match:
            raise LatexParseError(f"unexpected character {s[pos]!r}")
        num, name, op = match.groups()
        if num is not None:
            tokens.append(("num", num))
        elif name is not None:
            tokens.extend(_split_name(name))
        else:
            tokens.append(("op", op))
        pos = match.end()
        if len(tokens) > MAX_TOKENS:
            raise LatexParseError("expression too long")
    return tokens


def _split_name(name: str) -> list[tuple[str, str]]:
    """A known function/constant name is one token; other letter runs are implicit products."""
    if name in _FUNCTIONS or name in _CONSTANTS:
        return [("name", name)]
    return [("name", letter) for letter in name]


class _Parser:
    """Recursive-descent parser over the plain grammar, building sympy objects.

    expr := term (('+'|'-') term)*;  term := unary (('*'|'/') unary | implicit unary)*;
    unary := ('-'|'+') unary | power;  power := primary ('^' unary)?;
    primary := number | symbol | constant | function primary | '(' expr ')'
    """

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.pos = tokens, 0

    def peek(self) -> tuple[str, str] | None:
        """The next token, or None at the end."""
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, text: str | None = None) -> tuple[str, str]:
        """Consume the next token (which must be `text` when given)."""
        tok = self.peek()
        if tok is None or (text is not None and tok[1] != text):
            raise LatexParseError(f"expected {text or 'a token'}, got {tok}")
        self.pos += 1
        return tok

    def parse(self) -> sympy.Expr:
        """Parse the whole token list as one expression."""
        expr = self.expr()
        if self.peek() is not None:
            raise LatexParseError(f"trailing token {self.peek()}")
        return expr

    def expr(self) -> sympy.Expr:
        """Sums and differences."""
        value = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> sympy.Expr:
        """Products and quotients, including implicit multiplication."""
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in (("op", "*"), ("op", "/")):
                self.take()
                rhs = self.unary()
                value = value * rhs if tok[1] == "*" else value / rhs
            elif tok is not None and (tok[0] != "op" or tok[1] == "("):
                value = value * self.power()  # implicit multiplication: 2x, 2sqrt(2), (a)(b)
            else:
                return value

    def unary(self) -> sympy.Expr:
        """Leading signs."""
        if self.peek() in (("op", "-"), ("op", "+")):
            sign = self.take()[1]
            value = self.unary()
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> sympy.Expr:
        """Right-associative powers, with numeric size guards."""
        base = self.primary()
        if self.peek() != ("op", "^"):
            return base
        self.take()
        exponent = self.unary()
        if exponent.is_number and (not exponent.is_finite or abs(exponent) > MAX_NUMERIC_EXPONENT):
            raise LatexParseError(f"exponent {exponent} too large")
        if base.is_Rational and exponent.is_number:
            bits = max(abs(base.p).bit_length(), base.q.bit_length())
            if bits * abs(exponent) > MAX_POWER_BITS:  # (2^64)^64)^64... must not hang sympy
                raise LatexParseError("power too large")
        return sympy.Pow(base, exponent)

    def primary(self) -> sympy.Expr:
        """Numbers, symbols, constants, function applications, parenthesised groups."""
        kind, text = self.take()
        if kind == "num":
            if len(text) > MAX_NUMBER_DIGITS:
                raise LatexParseError("number too long")
            return sympy.Rational(text)
        if kind == "name" and text in _CONSTANTS:
            return _CONSTANTS[text]
        if kind == "name" and text in _FUNCTIONS:
            if self.peek() == ("op", "("):  # sin(x)^2 is (sin x)^2: power() applies the ^ later
                return _FUNCTIONS[text](self.primary())
            return _FUNCTIONS[text](self.power())  # sin x^2 is sin(x^2)
        if kind == "name":
            return sympy.Symbol(text)
        if text == "(":
            value = self.expr()
            self.take(")")
            return value
        raise LatexParseError(f"unexpected {text!r}")


def parse_plain(s: str) -> sympy.Expr:
    """Parse the plain grammar (numbers, letters, + - * / ^, parentheses, sqrt/sin/.../pi/oo).

    Decimals become exact rationals ("0.5" -> 1/2). Raises LatexParseError outside the grammar.
    """
    tokens = _tokenize(s)
    if not tokens:
        raise LatexParseError("empty expression")
    return _Parser(tokens).parse()


def parse_latex_expr(s: str) -> sympy.Expr | None:
    """Parse a normalised LaTeX-ish answer into a sympy expression; None when it cannot be.

    Only `LatexParseError` (input outside the grammar or over the size caps) is turned into None.
    """
    if len(s) > MAX_EXPR_CHARS:
        return None
    try:
        return parse_plain(to_plain(s))
    except LatexParseError:
        return None


def _is_finite_number(value: sympy.Expr) -> bool:
    """A number that is not infinite, complex-infinite or NaN."""
    return bool(value.is_number) and not value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo)


def _numeric_close(a: sympy.Expr, b: sympy.Expr) -> bool | None:
    """Compare two symbol-free expressions numerically; None if either is not a finite number."""
    va, vb = sympy.N(a, 30), sympy.N(b, 30)
    if not (_is_finite_number(va) and _is_finite_number(vb)):
        return None
    diff = abs(sympy.N(va - vb, 30))
    return bool(diff <= REL_TOL * max(1, abs(va), abs(vb)))


def _probe_points(symbols: list[sympy.Symbol]) -> list[dict]:
    """A few fixed, 'generic' rational substitution points for a quick inequality check."""
    bases = (sympy.Rational(37, 100), sympy.Rational(113, 100), sympy.Rational(271, 100))
    return [
        {sym: base + sympy.Rational(k, 7) for k, sym in enumerate(symbols)} for base in bases
    ]


def sympy_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two parsed answers are mathematically equal.

    Exact rationals compare exactly; other symbol-free values within a relative 1e-9; expressions
    with symbols must agree at a few probe points and then simplify to a zero difference.
    """
    if a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
        return False  # 1/0 is no answer, and must not equal 2/0
    if a == b:
        return True
    diff = a - b
    if diff.is_Rational:
        return diff == 0
    symbols = sorted(diff.free_symbols, key=lambda sym: sym.name)
    if not symbols:
        return bool(_numeric_close(a, b))
    for point in _probe_points(symbols):
        if _numeric_close(a.subs(point), b.subs(point)) is False:  # None: undefined there, skip
            return False
    return sympy.simplify(diff) == 0
