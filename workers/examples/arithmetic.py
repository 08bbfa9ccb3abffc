"""Arithmetic tools: the smallest real tools, exact and deterministic."""

from __future__ import annotations

from workers import tool


@tool(soft_time_limit=5, time_limit=10)
def add(a: float, b: float) -> float:
    """Add two numbers and return the sum.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


@tool(soft_time_limit=5, time_limit=10)
def subtract(a: float, b: float) -> float:
    """Subtract b from a and return the difference.

    Args:
        a: the minuend
        b: the subtrahend
    """
    return a - b


@tool(soft_time_limit=5, time_limit=10)
def multiply(a: float, b: float) -> float:
    """Multiply two numbers and return the product.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


@tool(soft_time_limit=5, time_limit=10)
def divide(a: float, b: float) -> float:
    """Divide a by b and return the quotient; dividing by zero is an error.

    Args:
        a: the dividend
        b: the divisor, not zero
    """
    if b == 0:
        raise ZeroDivisionError("cannot divide by zero")
    return a / b
