"""The scripted `demo` model: arithmetic and weather questions answered with the demo tools (pure).

It reads the last user message and the tool results that followed it, and either asks for the calls still
needed or gives its final answer:

- Arithmetic: each clause of the message (split at `,` `;` `?` `!`, a sentence's `.` and the word "and")
  that holds an expression — numbers, `+ - * / x × ÷`, parentheses, the words plus, minus, times,
  multiplied (by), divided (by) — is computed with the offered tools `add`, `subtract`, `multiply` and
  `divide`, with the usual precedence (× and ÷ before + and −). A clause that starts with an operator
  continues the one before it: "What is 2+3, times 4?" is (2 + 3) × 4. The calls whose operands are known
  go out together, in parallel; the next round uses their results: add(2, 3), then multiply(5, 4).
- Weather: a message with the word "weather" calls `get_weather` for each capitalised place after in, for
  or at (Paris when it names none), in the first round, beside the arithmetic.

The final answer states each result ("(2 + 3) × 4 = 20"), then lists every tool result. A tool that failed,
or answered something that is not a number, ends its expression with what it said. Argument names come from
each offered tool's schema (its first two numbers, its first string), so a renamed parameter does not break
it. A message with nothing it can do gets a text answer that says what it understands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.providers.scripted.conversation import (
    build_call_text,
    build_summary,
    content_text,
    last_user,
    last_user_index,
    tool_results_after_last_user,
)
from orchestrator.providers.scripted.wire import Answer, PlannedCall

WEATHER_TOOL = "get_weather"
DEFAULT_CITY = "Paris"
# An operator symbol → the demo tool that computes it, its precedence, and how an answer writes it.
OPERATORS: dict[str, tuple[str, int, str]] = {
    "+": ("add", 1, "+"),
    "-": ("subtract", 1, "-"),
    "*": ("multiply", 2, "×"),
    "/": ("divide", 2, "÷"),
}
_WORD_OPERATORS = {"plus": "+", "minus": "-", "times": "*", "x": "*", "multiplied": "*", "divided": "/"}
_SYMBOLS = {"×": "*", "÷": "/"}
# A clause longer than this is no arithmetic question; it also bounds the parser's recursion.
MAX_TOKENS = 64
# Rounds after which the model answers with what it has, whatever is left: a turn never loops on it.
MAX_ROUNDS = 8
HINT = 'Try "What is 2+3, times 4?" or "What is the weather in Paris?"'

_TOKEN = re.compile(r"(?P<number>\d+(?:\.\d+)?)|(?P<word>[A-Za-z]+)|(?P<symbol>[-+*/×÷()])")
_CLAUSE_END = re.compile(r"[,;?!\n]|\.(?!\d)|\band\b", re.IGNORECASE)
_CITY = re.compile(r"\b(?:in|for|at)\s+([A-Z][\w\-]*(?:\s+[A-Z][\w\-]*)*)")


@dataclass(frozen=True)
class Num:
    """A number of the question."""

    value: float


@dataclass(frozen=True)
class Op:
    """An operation of two expressions, computed by one tool call."""

    symbol: str
    left: Expr
    right: Expr


Expr = Num | Op
Token = float | str | Expr  # a number, an operator or parenthesis, or the expression a clause continues


def build_demo_answer(
    messages: Sequence[Mapping[str, Any]], tools: Mapping[str, Mapping[str, Any]]
) -> Answer:
    """The demo model's answer: the calls still needed, or the final text."""
    prompt = content_text(last_user(messages)) or ""
    results = build_result_index(messages)
    expressions = parse_expressions(prompt)
    cities = parse_cities(prompt)
    if not expressions and not cities:
        summary = build_summary(tool_results_after_last_user(messages))
        return Answer(text=summary or f"No demo tool fits this request. You said: {prompt}\n{HINT}")
    lines: list[str] = []
    calls: list[PlannedCall] = []
    for expression in expressions:
        value, problem, needed = evaluate(expression, tools, results)
        calls += needed
        if not needed:
            lines.append(f"{render(expression)} = {format_number(value)}" if problem is None else problem)
    for city in cities:
        line, needed = _weather(city, tools, results)
        calls += needed
        lines += [line] if line else []
    unique = list({_key(c.name, c.arguments or {}): c for c in calls}.values())
    if unique and _rounds_so_far(messages) < MAX_ROUNDS:
        return Answer(calls=tuple(unique))
    summary = build_summary(tool_results_after_last_user(messages))
    return Answer(text="\n\n".join(part for part in ("\n".join(lines), summary) if part) or "Done.")


def parse_expressions(prompt: str) -> list[Expr]:
    """The arithmetic of a message, one expression per clause. A clause opening with an operator continues
    the previous clause, even one that was a lone number ("What is 5, minus 3?")."""
    parsed: list[Expr] = []
    for clause in _CLAUSE_END.split(prompt):
        tokens = tokenize(clause)
        if not tokens or len(tokens) > MAX_TOKENS:
            continue
        continues = bool(parsed) and isinstance(tokens[0], str) and tokens[0] in OPERATORS
        if continues:
            tokens = [parsed[-1], *tokens]
        elif tokens[0] == "-" and len(tokens) > 1 and isinstance(tokens[1], float):
            tokens = [-tokens[1], *tokens[2:]]  # a clause's first number, negative
        expression = _Parser(tokens).parse()
        if expression is None:
            continue
        if continues:
            parsed[-1] = expression
        else:
            parsed.append(expression)
    return [expression for expression in parsed if isinstance(expression, Op)]


def tokenize(clause: str) -> list[Token]:
    """Numbers, operators and parentheses of a clause; other words are skipped. A `-` right after an
    operator or `(` and before a number is that number's sign (at the start of a clause, the caller decides:
    it may continue the previous clause)."""
    tokens: list[Token] = []
    for match in _TOKEN.finditer(clause):
        number, word, symbol = match.group("number", "word", "symbol")
        if number is not None:
            if len(tokens) >= 2 and tokens[-1] == "-" and tokens[-2] in (*OPERATORS, "("):
                tokens[-1] = -float(number)
            else:
                tokens.append(float(number))
            continue
        operator = _WORD_OPERATORS.get(word.lower()) if word is not None else _SYMBOLS.get(symbol, symbol)
        if operator is not None:
            tokens.append(operator)
    return tokens


class _Parser:
    """Precedence climbing: expr := term (("+" | "-") term)*; term := factor (("*" | "/") factor)*;
    factor := number | "(" expr ")"."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        self.tokens = list(tokens)
        self.position = 0

    def parse(self) -> Expr | None:
        expression = self._binary(1)
        return expression if self.position == len(self.tokens) else None

    def _peek(self) -> Token | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _binary(self, precedence: int) -> Expr | None:
        left = self._factor() if precedence > 2 else self._binary(precedence + 1)
        while left is not None:
            symbol = self._peek()
            if not isinstance(symbol, str) or OPERATORS.get(symbol, ("", 0))[1] != precedence:
                return left
            self.position += 1
            right = self._binary(precedence + 1)
            left = None if right is None else Op(symbol, left, right)
        return None

    def _factor(self) -> Expr | None:
        token = self._peek()
        self.position += 1
        if isinstance(token, float):
            return Num(token)
        if isinstance(token, Num | Op):
            return token
        if token == "(":
            inner = self._binary(1)
            if self._peek() == ")":
                self.position += 1
                return inner
        return None


def parse_cities(prompt: str) -> list[str]:
    """The places whose weather a message asks for: none without the word "weather"."""
    if "weather" not in prompt.lower():
        return []
    return list(dict.fromkeys(_CITY.findall(prompt))) or [DEFAULT_CITY]


def evaluate(
    expression: Expr, tools: Mapping[str, Mapping[str, Any]], results: Mapping[tuple[str, str], str]
) -> tuple[float | None, str | None, list[PlannedCall]]:
    """(value, problem, calls still needed) of an expression, from the tool results so far."""
    if isinstance(expression, Num):
        return expression.value, None, []
    left, left_problem, left_calls = evaluate(expression.left, tools, results)
    right, right_problem, right_calls = evaluate(expression.right, tools, results)
    if left_problem or right_problem or left_calls or right_calls:
        return None, left_problem or right_problem, left_calls + right_calls
    assert left is not None and right is not None
    tool = OPERATORS[expression.symbol][0]
    if tool not in tools:
        return None, f"{render(expression)}: the {tool} tool is not offered in this turn", []
    arguments = build_number_arguments(tools[tool], left, right)
    content = results.get(_key(tool, arguments))
    if content is None:
        return None, None, [PlannedCall(tool, arguments)]
    value = parse_number(content)
    if value is None:
        call = build_call_text(tool, json.dumps(arguments))
        return None, f"{render(expression)}: {call} answered {content}", []
    return value, None, []


def _weather(
    city: str, tools: Mapping[str, Mapping[str, Any]], results: Mapping[tuple[str, str], str]
) -> tuple[str | None, list[PlannedCall]]:
    if WEATHER_TOOL not in tools:
        return f"The weather in {city}: the {WEATHER_TOOL} tool is not offered in this turn.", []
    arguments = build_string_arguments(tools[WEATHER_TOOL], city)
    content = results.get(_key(WEATHER_TOOL, arguments))
    if content is None:
        return None, [PlannedCall(WEATHER_TOOL, arguments)]
    return f"The weather in {city}: {content}", []


def render(expression: Expr, parent: int = 0, right_side: bool = False) -> str:
    """An expression as an answer writes it, with the parentheses its precedence needs: `(2 + 3) × 4`."""
    if isinstance(expression, Num):
        return format_number(expression.value)
    _, precedence, shown = OPERATORS[expression.symbol]
    text = f"{render(expression.left, precedence)} {shown} {render(expression.right, precedence, True)}"
    needs_parentheses = precedence < parent or (right_side and precedence == parent)
    return f"({text})" if needs_parentheses else text


def format_number(value: float | None) -> str:
    """`20.0` → `20`, `2.5` → `2.5`."""
    if value is None:
        return "?"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def parse_number(content: str) -> float | None:
    """A tool's answer as a number, or None when it is not one (an error, a text)."""
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def build_result_index(messages: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """The tool results since the last user message, by (tool, canonical arguments): how a round finds
    which of the calls it needs were made already."""
    return {
        _key(result.name, _decode_arguments(result.arguments)): result.content
        for result in tool_results_after_last_user(messages)
    }


def build_number_arguments(schema: Mapping[str, Any], a: float, b: float) -> dict[str, Any]:
    """`{first: a, second: b}` for the schema's first two number parameters (integers as ints)."""
    properties = _properties(schema)
    names = [n for n, p in properties.items() if _json_type(p) in ("number", "integer")] or ["a", "b"]
    integer = all(_json_type(properties.get(n, {})) == "integer" for n in names[:2])
    values = [int(v) if integer or v.is_integer() else v for v in (a, b)]
    return dict(zip(names[:2], values, strict=False))


def build_string_arguments(schema: Mapping[str, Any], value: str) -> dict[str, Any]:
    """`{first: value}` for the schema's first string parameter."""
    names = [n for n, p in _properties(schema).items() if _json_type(p) == "string"] or ["city"]
    return {names[0]: value}


def _key(name: str, arguments: Mapping[str, Any]) -> tuple[str, str]:
    return name, json.dumps(arguments, sort_keys=True)


def _decode_arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _rounds_so_far(messages: Sequence[Mapping[str, Any]]) -> int:
    index = last_user_index(messages)
    later = messages if index is None else messages[index + 1 :]
    return sum(1 for m in later if m.get("role") == "assistant")


def _properties(schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties")
    return dict(properties) if isinstance(properties, Mapping) else {}


def _json_type(prop: object) -> str | None:
    if not isinstance(prop, Mapping):
        return None
    kind = prop.get("type")
    if isinstance(kind, str):
        return kind
    # pydantic writes Optional fields as anyOf [{type}, {type: null}].
    for option in prop.get("anyOf", []):
        if isinstance(option, Mapping) and option.get("type") not in (None, "null"):
            return str(option["type"])
    return None
