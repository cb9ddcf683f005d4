"""``processors.redaction``: what content never leaves otel-llm, and the attribute limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from otel_llm.confmap import PositiveInt


# Content attributes of every instrumentation the README's table lists (its "content keys" column).
DEFAULT_CONTENT_PREFIXES = [
    # OTel GenAI semconv, current and legacy (OpenLLMetry's indexed gen_ai.prompt.N.* included)
    "gen_ai.prompt", "gen_ai.completion", "gen_ai.input.messages", "gen_ai.output.messages",
    "gen_ai.system_instructions", "gen_ai.tool.definitions", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
    # OpenInference
    "llm.prompts", "llm.completions", "llm.input_messages", "llm.output_messages", "llm.prompt_template",
    "input.value", "output.value", "embedding.embeddings", "retrieval.documents", "reranker.",
    # Traceloop entity payloads
    "traceloop.entity.input", "traceloop.entity.output",
]
# Keys with a provider or other part in the middle: LiteLLM's llm.<provider>.messages / .choices.
DEFAULT_CONTENT_PATTERNS = ["llm.*.messages*", "llm.*.choices*"]



@dataclass(frozen=True)
class RedactionProcessor:
    """Prompt and completion content never leaves otel-llm unless allowed."""

    allow_content: bool = False
    blocked_key_prefixes: list[str] = field(default_factory=lambda: list(DEFAULT_CONTENT_PREFIXES))
    blocked_key_patterns: list[str] = field(default_factory=lambda: list(DEFAULT_CONTENT_PATTERNS))
    # The user's own additions, so adding one never means restating (and risking) the defaults:
    # an entry with "*" is a glob, any other a key prefix.
    additional_blocked_keys: list[str] = field(default_factory=list)
    blocked_event_names: list[str] = field(default_factory=lambda: [
        "gen_ai.content.prompt", "gen_ai.content.completion", "gen_ai.client.inference.operation.details",
        "gen_ai.user.message", "gen_ai.assistant.message", "gen_ai.system.message", "gen_ai.tool.message",
        "gen_ai.choice"])
    # On a GenAI span (one with a gen_ai./llm./openinference./traceloop. attribute), any text value
    # longer than this is removed unless its key is allowed: content under a key nobody listed. 0: off.
    max_free_text_bytes: int = 512
    allowed_keys: list[str] = field(default_factory=lambda: ["exception.stacktrace"])
    max_attribute_value_bytes: PositiveInt = 16 * 1024  # longer string values are truncated
    max_attributes_per_span: PositiveInt = 256  # further attributes are dropped

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_attribute_value_bytes": (1, 64 * 1024 * 1024),
        "max_attributes_per_span": (1, 100_000),
        "max_free_text_bytes": (0, 64 * 1024 * 1024),
    }
