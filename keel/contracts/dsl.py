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

The text is tokenised and parsed into a polars expression by hand; it is never passed to eval/exec, so a rule
can only ever read columns and compare values.

Semantics follow SQL CHECK constraints: a row violates the rule only when the condition is definitely false. A
comparison with a null operand is unknown and passes; use ``is null`` / ``is not null`` to test nulls. With
``A when B`` the row is checked only where ``B`` is true.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class ParsedCondition:
    """A parsed condition: the polars expression that is True where a row *violates* it, and the columns read."""

    violation: pl.Expr
    columns: frozenset[str]
    text: str


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.columns: set[str] = set()

    # -- token helpers
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

    # -- grammar
    def condition(self) -> pl.Expr:
        check = self.expr()
        if self.accept("kw", "when"):
            guard = self.expr()
            # Violated only where the guard is definitely true and the check definitely false.
            violation = guard.fill_null(False) & check.not_().fill_null(False)
        else:
            violation = check.not_().fill_null(False)
        end = self.peek()
        if end.kind != "end":
            raise DslError(f"unexpected {_describe(end)}", end.pos)
        return violation

    def expr(self) -> pl.Expr:
        left = self.and_expr()
        while self.accept("kw", "or"):
            left = left | self.and_expr()
        return left

    def and_expr(self) -> pl.Expr:
        left = self.not_expr()
        while self.accept("kw", "and"):
            left = left & self.not_expr()
        return left

    def not_expr(self) -> pl.Expr:
        if self.accept("kw", "not"):
            return self.not_expr().not_()
        return self.predicate()

    def predicate(self) -> pl.Expr:
        left = self.sum()
        tok = self.peek()
        if tok.kind == "op" and tok.value in _CMP:
            self.take()
            right = self.sum()
            op = tok.value
            if op in ("==", "="):
                return left == right
            if op in ("!=", "<>"):
                return left != right
            if op == "<":
                return left < right
            if op == "<=":
                return left <= right
            if op == ">":
                return left > right
            return left >= right
        if self.accept("kw", "is"):
            negated = self.accept("kw", "not") is not None
            self.expect("kw", "null", "'null' after 'is'")
            return left.is_not_null() if negated else left.is_null()
        negated_in = False
        if (
            tok.kind == "kw"
            and tok.value == "not"
            and self.tokens[self.i + 1].kind == "kw"
            and self.tokens[self.i + 1].value == "in"
        ):
            self.take()
            negated_in = True
        if self.accept("kw", "in"):
            self.expect("op", "(", "'(' after 'in'")
            values = [self.literal()]
            while self.accept("op", ","):
                values.append(self.literal())
            self.expect("op", ")", "')' closing the 'in' list")
            member = left.is_in(pl.lit(pl.Series(values)).implode()) if values else pl.lit(False)
            # is_in on a null operand gives null (unknown), which passes, as in SQL.
            member = pl.when(left.is_null()).then(None).otherwise(member)
            return member.not_() if negated_in else member
        if negated_in:
            raise DslError("expected 'in' after 'not'", self.peek().pos)
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

    def sum(self) -> pl.Expr:
        left = self.term()
        while True:
            if self.accept("op", "+"):
                left = left + self.term()
            elif self.accept("op", "-"):
                left = left - self.term()
            else:
                return left

    def term(self) -> pl.Expr:
        left = self.unary()
        while True:
            if self.accept("op", "*"):
                left = left * self.unary()
            elif self.accept("op", "/"):
                left = left / self.unary()
            else:
                return left

    def unary(self) -> pl.Expr:
        if self.accept("op", "-"):
            return -self.unary()
        return self.atom()

    def atom(self) -> pl.Expr:
        tok = self.take()
        if tok.kind == "num" or tok.kind == "str":
            return pl.lit(tok.value)
        if tok.kind == "kw" and tok.value in ("true", "false"):
            return pl.lit(tok.value == "true")
        if tok.kind == "kw" and tok.value == "null":
            return pl.lit(None)
        if tok.kind == "name":
            self.columns.add(tok.value)
            return pl.col(tok.value)
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
    """Parse a condition into the polars expression that marks violating rows."""
    if not isinstance(text, str) or not text.strip():
        raise DslError("the condition is empty", 0)
    parser = _Parser(text)
    violation = parser.condition()
    return ParsedCondition(violation=violation, columns=frozenset(parser.columns), text=text)
