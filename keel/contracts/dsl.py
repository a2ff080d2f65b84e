"""A small, parsed condition language for row-level rules between columns.

    arr_time is not null when dep_time is not null
    dep_delay >= -60 and dep_delay <= 1440
    origin in ('EWR', 'JFK', 'LGA') or distance > 0
    air_time * 8 <= distance + 600 when air_time is not null

Grammar (keywords are case-insensitive)::

    condition  := expr [ 'when' expr ]
    expr       := and_expr ( 'or' and_expr )*
    and_expr   := not_expr ( 'and' not_expr )*
    not_expr   := 'not' not_expr | predicate
    predicate  := sum ( CMP sum | 'is' ['not'] 'null' | ['not'] 'in' '(' literal (',' literal)* ')' )?
    sum        := term ( ('+' | '-') term )*
    term       := unary ( ('*' | '/') unary )*
    unary      := '-' unary | atom
    atom       := NUMBER | STRING | 'true' | 'false' | 'null' | COLUMN | '(' expr ')'

The text is tokenised and parsed by hand into a small syntax tree; it is never passed to eval/exec, so a rule can
only ever read columns and compare values. The tree has two backends with one meaning: a polars expression for
batches and a Python evaluator for single records (the serving path), kept equal by property tests.

Semantics follow SQL CHECK constraints: a row violates the rule only when the condition is definitely false. A
comparison with a null operand is unknown and passes; use ``is null`` / ``is not null`` to test nulls. With
``A when B`` the row is checked only where ``B`` is true.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

_KEYWORDS = {"and", "or", "not", "is", "null", "in", "when", "true", "false"}
_CMP = {"==", "=", "!=", "<>", "<", "<=", ">", ">="}


class DslError(ValueError):
    """The condition text is not valid; ``position`` is a 0-based character offset."""

    def __init__(self, message: str, position: int):
        self.position = position
        super().__init__(f"{message} (at character {position + 1})")


@dataclass(frozen=True)
class Token:
    kind: str  # "num", "str", "name", "kw", "op", "end"
    value: Any
    pos: int


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i
            while j < n and (text[j].isdigit() or text[j] == "."):
                j += 1
            if j < n and text[j] in "eE":
                k = j + 1
                if k < n and text[k] in "+-":
                    k += 1
                if k < n and text[k].isdigit():
                    j = k
                    while j < n and text[j].isdigit():
                        j += 1
            raw = text[i:j]
            try:
                value: Any = int(raw) if raw.isdigit() else float(raw)
            except ValueError:
                raise DslError(f"malformed number '{raw}'", i) from None
            tokens.append(Token("num", value, i))
            i = j
            continue
        if c in "'\"":
            j = i + 1
            buf = []
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                buf.append(text[j])
                j += 1
            if j >= n:
                raise DslError("unterminated string", i)
            tokens.append(Token("str", "".join(buf), i))
            i = j + 1
            continue
        if c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if word.lower() in _KEYWORDS:
                tokens.append(Token("kw", word.lower(), i))
            else:
                tokens.append(Token("name", word, i))
            i = j
            continue
        two = text[i : i + 2]
        if two in ("==", "!=", "<>", "<=", ">="):
            tokens.append(Token("op", two, i))
            i += 2
            continue
        if c in "=<>+-*/(),":
            tokens.append(Token("op", c, i))
            i += 1
            continue
        raise DslError(f"unexpected character {c!r}", i)
    tokens.append(Token("end", None, n))
    return tokens


# -- syntax tree ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    op: str  # col, lit, neg, arith, cmp, and, or, not, isnull, notnull, in, notin
    args: tuple[Any, ...]


@dataclass(frozen=True)
class ParsedCondition:
    """A parsed condition ``check [when guard]``: compile it to polars, or evaluate it on one record."""

    check: Node
    guard: Node | None
    columns: frozenset[str]
    text: str

    @property
    def violation(self) -> pl.Expr:
        """True where a row violates the condition (never null)."""
        check = to_polars(self.check)
        if self.guard is None:
            return check.not_().fill_null(False)
        return to_polars(self.guard).fill_null(False) & check.not_().fill_null(False)

    def violated_by(self, row: dict[str, Any]) -> bool:
        """The same verdict for one record (a mapping of column -> typed value)."""
        if self.guard is not None and evaluate(self.guard, row) is not True:
            return False
        return evaluate(self.check, row) is False


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.columns: set[str] = set()

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, value: Any = None) -> Token | None:
        tok = self.peek()
        if tok.kind == kind and (value is None or tok.value == value):
            return self.take()
        return None

    def expect(self, kind: str, value: Any, what: str) -> Token:
        tok = self.accept(kind, value)
        if tok is None:
            got = self.peek()
            raise DslError(f"expected {what}, found {_describe(got)}", got.pos)
        return tok

    def condition(self) -> tuple[Node, Node | None]:
        check = self.expr()
        guard = self.expr() if self.accept("kw", "when") else None
        end = self.peek()
        if end.kind != "end":
            raise DslError(f"unexpected {_describe(end)}", end.pos)
        return check, guard

    def expr(self) -> Node:
        left = self.and_expr()
        while self.accept("kw", "or"):
            left = Node("or", (left, self.and_expr()))
        return left

    def and_expr(self) -> Node:
        left = self.not_expr()
        while self.accept("kw", "and"):
            left = Node("and", (left, self.not_expr()))
        return left

    def not_expr(self) -> Node:
        if self.accept("kw", "not"):
            return Node("not", (self.not_expr(),))
        return self.predicate()

    def predicate(self) -> Node:
        left = self.sum()
        tok = self.peek()
        if tok.kind == "op" and tok.value in _CMP:
            self.take()
            op = {"=": "==", "<>": "!="}.get(tok.value, tok.value)
            return Node("cmp", (op, left, self.sum()))
        if self.accept("kw", "is"):
            negated = self.accept("kw", "not") is not None
            self.expect("kw", "null", "'null' after 'is'")
            return Node("notnull" if negated else "isnull", (left,))
        negated_in = False
        nxt = self.tokens[self.i + 1]
        if tok.kind == "kw" and tok.value == "not" and nxt.kind == "kw" and nxt.value == "in":
            self.take()
            negated_in = True
        if self.accept("kw", "in"):
            self.expect("op", "(", "'(' after 'in'")
            values = [self.literal()]
            while self.accept("op", ","):
                values.append(self.literal())
            self.expect("op", ")", "')' closing the 'in' list")
            return Node("notin" if negated_in else "in", (left, tuple(values)))
        return left

    def literal(self) -> Any:
        tok = self.take()
        if tok.kind in ("num", "str"):
            return tok.value
        if tok.kind == "op" and tok.value == "-" and self.peek().kind == "num":
            return -self.take().value
        if tok.kind == "kw" and tok.value in ("true", "false"):
            return tok.value == "true"
        raise DslError(f"expected a literal value, found {_describe(tok)}", tok.pos)

    def sum(self) -> Node:
        left = self.term()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in "+-":
                self.take()
                left = Node("arith", (tok.value, left, self.term()))
            else:
                return left

    def term(self) -> Node:
        left = self.unary()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.value in "*/":
                self.take()
                left = Node("arith", (tok.value, left, self.unary()))
            else:
                return left

    def unary(self) -> Node:
        if self.accept("op", "-"):
            return Node("neg", (self.unary(),))
        return self.atom()

    def atom(self) -> Node:
        tok = self.take()
        if tok.kind in ("num", "str"):
            return Node("lit", (tok.value,))
        if tok.kind == "kw" and tok.value in ("true", "false"):
            return Node("lit", (tok.value == "true",))
        if tok.kind == "kw" and tok.value == "null":
            return Node("lit", (None,))
        if tok.kind == "name":
            self.columns.add(tok.value)
            return Node("col", (tok.value,))
        if tok.kind == "op" and tok.value == "(":
            inner = self.expr()
            self.expect("op", ")", "')'")
            return inner
        raise DslError(f"expected a column, a value or '(', found {_describe(tok)}", tok.pos)


def _describe(tok: Token) -> str:
    if tok.kind == "end":
        return "the end of the condition"
    return f"'{tok.value}'"


def parse_condition(text: str) -> ParsedCondition:
    """Parse a condition; ``.violation`` is the polars expression that marks violating rows."""
    if not isinstance(text, str) or not text.strip():
        raise DslError("the condition is empty", 0)
    parser = _Parser(text)
    check, guard = parser.condition()
    return ParsedCondition(check=check, guard=guard, columns=frozenset(parser.columns), text=text)


# -- backend 1: polars ------------------------------------------------------------------------------------------


def to_polars(node: Node) -> pl.Expr:
    op, a = node.op, node.args
    if op == "col":
        return pl.col(a[0])
    if op == "lit":
        return pl.lit(a[0])
    if op == "neg":
        return -to_polars(a[0])
    if op == "arith":
        left, right = to_polars(a[1]), to_polars(a[2])
        return {"+": left + right, "-": left - right, "*": left * right, "/": left / right}[a[0]]
    if op == "cmp":
        left, right = to_polars(a[1]), to_polars(a[2])
        return {
            "==": left == right,
            "!=": left != right,
            "<": left < right,
            "<=": left <= right,
            ">": left > right,
            ">=": left >= right,
        }[a[0]]
    if op == "and":
        return to_polars(a[0]) & to_polars(a[1])
    if op == "or":
        return to_polars(a[0]) | to_polars(a[1])
    if op == "not":
        return to_polars(a[0]).not_()
    if op == "isnull":
        return to_polars(a[0]).is_null()
    if op == "notnull":
        return to_polars(a[0]).is_not_null()
    if op in ("in", "notin"):
        left = to_polars(a[0])
        member = left.is_in(pl.lit(pl.Series(list(a[1]))).implode())
        # is_in on a null operand is unknown (null), which passes, as in SQL
        member = pl.when(left.is_null()).then(None).otherwise(member)
        return member.not_() if op == "notin" else member
    raise AssertionError(op)


# -- backend 2: one record in Python, with polars' semantics ----------------------------------------------------
# Nulls propagate (Kleene logic for and/or); '/' is true division and x/0 gives ±inf or NaN; NaN compares equal to
# NaN and greater than every number, as polars orders floats.


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def compare_values(op: str, x: Any, y: Any) -> bool:
    """A comparison of two non-null values as polars does it (NaN equals NaN and sorts above every number)."""
    if _is_nan(x) or _is_nan(y):
        # polars: NaN == NaN, NaN is the largest float
        kx = (1, 0.0) if _is_nan(x) else (0, x)
        ky = (1, 0.0) if _is_nan(y) else (0, y)
        x, y = kx, ky
    if op == "==":
        return x == y
    if op == "!=":
        return x != y
    if op == "<":
        return x < y
    if op == "<=":
        return x <= y
    if op == ">":
        return x > y
    return x >= y


def _divide(x: Any, y: Any) -> float:
    x, y = float(x), float(y)
    if y == 0.0:
        if x == 0.0 or math.isnan(x):
            return math.nan
        return math.copysign(math.inf, x) * math.copysign(1.0, y)
    return x / y


def evaluate(node: Node, row: dict[str, Any]) -> Any:
    op, a = node.op, node.args
    if op == "col":
        return row.get(a[0])
    if op == "lit":
        return a[0]
    if op == "neg":
        v = evaluate(a[0], row)
        return None if v is None else -v
    if op == "arith":
        x, y = evaluate(a[1], row), evaluate(a[2], row)
        if x is None or y is None:
            return None
        if a[0] == "/":
            return _divide(x, y)
        return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y}[a[0]]()
    if op == "cmp":
        x, y = evaluate(a[1], row), evaluate(a[2], row)
        if x is None or y is None:
            return None
        return compare_values(a[0], x, y)
    if op == "and":
        x, y = evaluate(a[0], row), evaluate(a[1], row)
        if x is False or y is False:
            return False
        return None if x is None or y is None else True
    if op == "or":
        x, y = evaluate(a[0], row), evaluate(a[1], row)
        if x is True or y is True:
            return True
        return None if x is None or y is None else False
    if op == "not":
        x = evaluate(a[0], row)
        return None if x is None else not x
    if op == "isnull":
        return evaluate(a[0], row) is None
    if op == "notnull":
        return evaluate(a[0], row) is not None
    if op in ("in", "notin"):
        x = evaluate(a[0], row)
        if x is None:
            return None
        member = any(v is not None and compare_values("==", x, v) for v in a[1])
        return (not member) if op == "notin" else member
    raise AssertionError(op)
