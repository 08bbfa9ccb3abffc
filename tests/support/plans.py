"""Prompts for the scripted `plan` model: it plays the JSON plan in its prompt round by round (a round of
tool calls, a text answer, an error…), so a test decides every model answer of its turn.

    prompt = plan_prompt([{"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}, {"text": "5"}])
    prompt, marker = marked_plan_prompt(rounds)   # the marker finds the turn's requests to the model

Each prompt starts with a marker no other prompt has, so that no two tests share a turn.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any


def plan_prompt(rounds: Sequence[Mapping[str, Any]]) -> str:
    """A prompt the scripted `plan` model plays round by round; unique, so no two tests share a turn."""
    return marked_plan_prompt(rounds)[0]


def marked_plan_prompt(rounds: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """`plan_prompt`, and the marker unique to it (to find or count its model requests)."""
    marker = f"marker-{uuid.uuid4().hex}"
    return f"{marker} " + json.dumps({"plan": list(rounds)}), marker
