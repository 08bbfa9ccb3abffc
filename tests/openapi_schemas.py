"""OpenAPI documents as JSON Schema validators for tests: OpenAI's published description (`../shared/specs/`),
and any document handed in, such as toolloop's own `/openapi.json` (`assert_valid_answer`)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache, lru_cache
from typing import Any

import jsonschema
import yaml

from tests.conftest import find_shared_dir


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The whole OpenAPI document, loaded once per test process."""
    with (find_shared_dir() / "specs" / "openai-openapi.yaml").open() as f:
        return dict(yaml.load(f, Loader=yaml.CSafeLoader))


def _allow_null(keyword: str) -> Any:
    checker = jsonschema.Draft202012Validator.VALIDATORS[keyword]

    def check(
        validator: jsonschema.protocols.Validator, value: object, instance: object, schema: dict[str, Any]
    ) -> Iterator[jsonschema.ValidationError]:
        # The document is OpenAPI 3.1 but still marks some fields with 3.0's `nullable: true`
        # (finish_reason and logprobs in stream chunks, which the real API sends as null).
        if instance is None and schema.get("nullable") is True:
            return
        yield from checker(validator, value, instance, schema)

    return check


OpenAPIValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {k: _allow_null(k) for k in ("type", "enum")}
)


@cache
def validator_for(schema_name: str) -> jsonschema.protocols.Validator:
    """A Draft 2020-12 validator of `#/components/schemas/<schema_name>`, refs resolved in the document."""
    # The whole document is the root so that `#/components/schemas/...` refs resolve inside it.
    schema = {**openapi_document(), "$ref": f"#/components/schemas/{schema_name}"}
    validator: jsonschema.protocols.Validator = OpenAPIValidator(schema)
    return validator


def assert_valid(instance: object, schema_name: str) -> None:
    """Raise jsonschema.ValidationError when `instance` is not a valid `schema_name`."""
    validator_for(schema_name).validate(instance)


def assert_valid_answer(document: dict[str, Any], method: str, path: str, status: int, body: Any) -> None:
    """Raise when `status` is not an answer `document` declares for `method` `path` (a template, as the
    document writes it), or `body` does not fit that answer's JSON schema (refs resolved in the document)."""
    answers = document["paths"][path][method]["responses"]
    assert str(status) in answers, f"{method.upper()} {path}: {status} is not declared ({sorted(answers)})"
    schema = answers[str(status)]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**document, **schema}).validate(body)
