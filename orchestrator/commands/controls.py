"""The model controls of `toolloop submit`: its flags read into a turn request's fields (pure).

`--setting KEY=JSON` (repeatable) goes into `model_settings.extra` as the provider-specific field `KEY`;
`--output-schema` is JSON text or `@file.json`. Each parser raises `ValueError` with a one-line reason, which
`submit` prints as its usage error (exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parse_setting(text: str) -> tuple[str, Any]:
    """`KEY=JSON` as (KEY, the parsed JSON value); a value that is not JSON is taken as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--setting {text!r} is not KEY=JSON (e.g. --setting top_k=40)")
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def read_json_option(text: str, option: str) -> tuple[Any, str]:
    """An option's JSON, written inline or read from the file after `@`, and how to name where it came from
    (`--replace`, `--replace file x.json`); `ValueError` with a one-line reason."""
    source = option
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"{option} file {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read {source}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text), source
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not valid JSON: {exc}") from exc


def parse_output_schema(text: str | None) -> dict[str, Any] | None:
    """`--output-schema` as a JSON object: the text itself, or the file after `@`."""
    if text is None:
        return None
    value, source = read_json_option(text, "--output-schema")
    if not isinstance(value, dict):
        raise ValueError(f"{source} must be a JSON object (a JSON Schema), not {type(value).__name__}")
    return value


def parse_client_tools(text: str | None) -> list[dict[str, Any]] | None:
    """`--client-tools` as a JSON list of tools the caller runs (`ClientTool`): the text, or the file after
    `@`."""
    if text is None:
        return None
    value, source = read_json_option(text, "--client-tools")
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise ValueError(f"{source} must be a JSON list of tools (name, description, parameters)")
    return value


def build_model_settings(
    *,
    temperature: float | None,
    top_p: float | None,
    max_output_tokens: int | None,
    stop: Sequence[str] | None,
    seed: int | None,
    reasoning_effort: str | None,
    parallel_tool_calls: bool | None,
    settings: Sequence[str] | None,
) -> dict[str, Any]:
    """The `model_settings` the flags give; those not given are left out (the provider's defaults)."""
    given: dict[str, Any] = {
        "temperature": temperature,
        "top_p": top_p,
        "max_output_tokens": max_output_tokens,
        "stop": list(stop) if stop else None,
        "seed": seed,
        "reasoning_effort": reasoning_effort,
        "parallel_tool_calls": parallel_tool_calls,
    }
    model_settings = {name: value for name, value in given.items() if value is not None}
    extra = dict(parse_setting(text) for text in settings or [])
    if extra:
        model_settings["extra"] = extra
    return model_settings


def build_model_names(models: Sequence[str] | None) -> str | list[str] | None:
    """`--model` given once is a name; given more than once, the fallback order."""
    if not models:
        return None
    return models[0] if len(models) == 1 else list(models)
