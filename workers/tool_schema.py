"""Reading a tool function: its parameters as a pydantic model, its docstring as descriptions.

`@tool` (workers.tools) calls these once, when a tool is defined: the model-facing parameters become a
pydantic model (the context parameter hidden, a lone pydantic-model parameter used as is), and the docstring's
summary and `Args:` section become the description and the per-argument descriptions of the JSON Schema.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from workers.contract import CONTEXT_PARAM_NAMES, ToolContext
from workers.errors import ToolDefinitionError

_ARGS_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$", re.IGNORECASE)
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)$")


def build_arguments_model(
    name: str, fn: Callable[..., Any]
) -> tuple[type[BaseModel], str | None, str | None]:
    """The pydantic model of the parameters the model fills in, the context parameter, the input parameter."""
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:  # unresolvable forward references are a definition error
        raise ToolDefinitionError(f"tool '{name}': cannot resolve its type hints: {exc}") from exc
    context_param: str | None = None
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        if param.name in CONTEXT_PARAM_NAMES and is_context_annotation(annotation):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool '{name}': *args/**kwargs cannot be described to a model")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"tool '{name}': positional-only parameter '{param.name}'")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    if len(fields) == 1:
        (only, (annotation, _)) = next(iter(fields.items()))
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            return annotation, context_param, only
    model: type[BaseModel] = create_model(
        f"{name}_arguments",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    return model, context_param, None


def is_context_annotation(annotation: Any) -> bool:
    """`ToolContext`, or `ToolContext | None` (a tool that also runs without one)."""
    if annotation is ToolContext:
        return True
    args = set(get_args(annotation))
    return get_origin(annotation) in (Union, UnionType) and args == {ToolContext, type(None)}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before an `Args:` section) and per-argument descriptions from that section."""
    summary: list[str] = []
    arg_docs: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if _ARGS_SECTION.match(line):
            in_args = True
            continue
        if in_args:
            match = _ARG_LINE.match(line)
            if match:
                arg_docs[match.group(1).lstrip("*")] = match.group(2).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                in_args = False  # the next section begins
        if not in_args and not _ARGS_SECTION.match(line):
            summary.append(line)
    return "\n".join(summary).strip(), arg_docs


def build_schema(model: type[BaseModel], arg_docs: Mapping[str, str], user_model: bool) -> dict[str, Any]:
    """The JSON Schema of a tool's parameters, with the docstring's per-argument descriptions."""
    schema = model.model_json_schema()
    if not user_model:
        schema.pop("title", None)
    properties = schema.setdefault("properties", {})
    for arg, text in arg_docs.items():
        if arg in properties and "description" not in properties[arg]:
            properties[arg]["description"] = text
    schema.setdefault("type", "object")
    return schema
