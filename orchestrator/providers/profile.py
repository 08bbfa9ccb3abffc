"""What a provider is, as data: one `ProviderProfile` each, declared in `providers/profiles/<name>.py`.

A model is named `provider:model`. Everything toolloop knows of a provider lives in its profile, and nowhere
else names it:

    wire           the module that speaks its wire format (`to_wire`, `from_wire`, `stream_reader`, …), by
                   its dotted name, imported only when a client is built
    endpoint       where calls go and how they are authorised: the default base URL, the variables that
                   override it and hold the key, the auth scheme; None for a format toolloop only reads
    traits         its wire family (providers of one family read each other's history as is) and the
                   tool-call ids it accepts
    controls       the model settings it cannot honour, the body fields `extra` may not replace, a check of
                   its own for combinations, and how it answers to an output schema
    accounting     its name under the GenAI conventions (tracing) and in the price table, whether it is
                   free, whether its input count leaves cached tokens out
    detection      the other names its bodies go by (`toolloop normalize --provider …`)

Pure data and pure functions: the state machine reads traits through `traits`, a submit reads controls
through `controls`; neither imports httpx or a wire module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from orchestrator.model import ModelSettings

if TYPE_CHECKING:
    from orchestrator.providers.sending import RequestAuth

SAFE_TOOL_CALL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
DEFAULT_TOOL_CALL_ID_MAX_CHARS = 40

AuthScheme = Literal["bearer", "header", "sigv4", "google", "none"]
"""How a call is authorised: `bearer` (the key as `Authorization: Bearer`), `header` (the key in a header of
the provider's own, `Endpoint.key_header`), `sigv4` (AWS Signature Version 4 from the AWS credential chain),
`google` (a Google OAuth token: application default credentials, or the key variable's static token), or
`none`."""

StructuredOutput = Literal["json_schema", "response_schema", "answer_tool"]
"""How an output schema reaches the model: a JSON-schema response format (OpenAI, Cohere), the provider's own
response schema (Gemini), or the answer tool (`structured.ANSWER_TOOL`: Anthropic, Bedrock)."""

ControlCheck = Callable[[ModelSettings, "str | None"], list[str]]
"""A provider's own refusals of a combination of settings (and the turn's tool_choice), as messages."""


@dataclass(frozen=True)
class Endpoint:
    """Where a provider's calls go and how they are authorised.

    `base_url_variable` overrides `default_base_url` (a base URL never ends in `/`); with neither, the
    model cannot be called and says which variable to set. A call to the provider's own host
    (`default_base_url`'s) without the key is answered at once, naming `key_variable`: a compatible server
    elsewhere may need none. `url_builder` is the wire module's function building one call's URL from the
    base URL and the model (`build_url(base_url, model, *, stream)`).
    """

    default_base_url: str | None
    base_url_variable: str | None
    key_variable: str | None = None
    auth: AuthScheme = "bearer"
    key_header: str = "authorization"
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    url_builder: str = "build_url"
    # The base URL from the variables when neither is set (Bedrock's regional endpoint, Vertex's project
    # and location); None when they do not say. `ModelConfigError` names what is missing.
    base_url_builder: Callable[[Mapping[str, str]], str | None] | None = None
    # What authorises each call when a fixed header cannot (`sigv4`, `google`), from the variables.
    auth_builder: Callable[[Mapping[str, str]], RequestAuth] | None = None
    # The variables a `sigv4` or `google` endpoint also reads (the region; the project and location).
    other_variables: tuple[str, ...] = ()

    @property
    def variables(self) -> tuple[str, ...]:
        """Every environment variable this endpoint reads."""
        named = (self.base_url_variable, self.key_variable, *self.other_variables)
        return tuple(name for name in named if name)


@dataclass(frozen=True)
class ProviderProfile:
    """Everything toolloop knows about one provider (see the module's docstring for the parts)."""

    name: str
    wire: str
    summary: str
    wire_family: str
    endpoint: Endpoint | None
    tool_call_id_max_chars: int = DEFAULT_TOOL_CALL_ID_MAX_CHARS
    tool_call_id_pattern: re.Pattern[str] = SAFE_TOOL_CALL_ID
    unsupported_settings: tuple[str, ...] = ()
    owned_fields: tuple[str, ...] = ()
    max_stop_sequences: int | None = None
    check_controls: ControlCheck | None = None
    structured_output: StructuredOutput = "json_schema"
    genai_name: str | None = None
    prices_provider: str | None = None
    free: bool = False
    unbounded_context: bool = False
    cache_apart: bool = False
    aliases: tuple[str, ...] = ()
    # Detection of an unlabelled body: wire modules are asked in rank order (their `sniff_*` functions);
    # None: this profile's wire is asked at its other profile's rank, or never. An unmistakable shape (no
    # other format shares it) wins over the name a caller gave.
    detect_rank: int | None = None
    unmistakable: bool = False
    # With no base URL configured, the registry serves the model itself (the in-process scripted server).
    serves_itself: bool = False
    # Extras a process needs to call this provider (`pip install 'celery-toolloop[<extra>]'`).
    extra: str | None = None

    @property
    def callable(self) -> bool:
        """True when toolloop can call this provider (not only read its bodies)."""
        return self.endpoint is not None

    def accepts_tool_call_id(self, call_id: str) -> bool:
        """True when the provider takes `call_id` as the id of a tool call (and of its result) as is."""
        fits = len(call_id) <= self.tool_call_id_max_chars
        return fits and self.tool_call_id_pattern.match(call_id) is not None
