"""AWS Bedrock's Converse API (and ConverseStream), signed with SigV4 from the AWS credential chain."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.providers.profile import Endpoint, ProviderProfile

if TYPE_CHECKING:
    from orchestrator.providers.sending import RequestAuth

# botocore's endpoint overrides, in its order (`sigv4.build_base_url`), and the flag that ignores them.
ENDPOINT_VARIABLES = (
    "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
    "AWS_ENDPOINT_URL",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
)


def build_region(values: Mapping[str, str]) -> str:
    """The AWS region calls go to: AWS_REGION, else AWS_DEFAULT_REGION, as the AWS SDKs read them."""
    # Imported here: a profile is read by the state machine, which loads no error tree, no botocore.
    from orchestrator.errors import ModelConfigError

    region = values.get("AWS_REGION") or values.get("AWS_DEFAULT_REGION")
    if not region:
        raise ModelConfigError(
            "bedrock models need AWS_REGION (or AWS_DEFAULT_REGION) in the orchestrator's environment"
        )
    return region


def build_base_url(values: Mapping[str, str]) -> str:
    """The Bedrock runtime endpoint of the region, or the one botocore's own variables configure."""
    from orchestrator.providers import sigv4

    return sigv4.build_base_url(values, build_region(values))


def build_auth(values: Mapping[str, str]) -> RequestAuth:
    """SigV4 for the region, with credentials from the standard AWS chain (resolved at the first call)."""
    from orchestrator.providers import sigv4

    return sigv4.SigV4Auth(build_region(values))


PROFILE = ProviderProfile(
    name="bedrock",
    wire="orchestrator.providers.bedrock",
    summary=(
        "AWS Bedrock Converse in AWS_REGION, credentials from the AWS chain "
        "(AWS_ENDPOINT_URL_BEDROCK_RUNTIME overrides the endpoint)"
    ),
    wire_family="bedrock",
    endpoint=Endpoint(
        default_base_url=None,
        # botocore's own overrides (ENDPOINT_VARIABLES) are read by the builder.
        base_url_variable=None,
        auth="sigv4",
        base_url_builder=build_base_url,
        auth_builder=build_auth,
        other_variables=("AWS_REGION", "AWS_DEFAULT_REGION", *ENDPOINT_VARIABLES),
    ),
    # Converse's toolUseId (botocore's service model): [a-zA-Z0-9_.:-]+, at most 64 characters.
    tool_call_id_max_chars=64,
    tool_call_id_pattern=re.compile(r"^[a-zA-Z0-9_.:-]+$"),
    unsupported_settings=("seed", "parallel_tool_calls"),
    # The model is the URL's, the conversation toolloop's.
    owned_fields=("modelId", "messages"),
    structured_output="answer_tool",
    genai_name="aws.bedrock",
    prices_provider="aws",
    # Converse reports cache reads and writes apart from inputTokens.
    cache_apart=True,
    detect_rank=50,
    unmistakable=True,
    aliases=("bedrock_converse", "aws_bedrock"),
    extra="bedrock",
)
