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

# Privacy by allowlist: the only span, event and link attribute keys whose *text* (a string, or an
# array or map) is kept on a stored or exported span. A number or a boolean carries no text and is
# kept under any key; every other text value is removed (``not_allowed``) unless ``allowed_keys``
# names its key. So an instrumentation nobody has seen cannot put its prompts on disk under a key
# no block list names. Three sources, nothing else:
# 1. The keys otel-llm's adapters read (processor/llm_metrics/adapters/engines.py, requests.py), so a
#    stored trace still shows what it was measured from.
METADATA_KEYS_READ = [
    # GenAI semconv and vLLM / trtllm-serve (whose latencies are numbers: kept anyway)
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
    "gen_ai.response.model", "gen_ai.response.finish_reasons", "gen_ai.token.type", "gen_ai.request.id",
    "error.type", "server.address", "http.route", "url.path", "request.outcome",
    # TGI (durations as text: "1.2ms"), Dynamo, SGLang, Triton, llm-d
    "total_time", "validation_time", "queue_time", "inference_time", "time_per_token",
    "model", "target_model", "finish_reason", "disagg_role", "module", "role", "route", "sglang_stage",
    "triton.model_name", "triton.trace_parent_id",
    "llm_d.pd_proxy.connector", "llm_d.pd_proxy.prefill", "llm_d.pd_proxy.decode",
]
# 2. The OTel semantic conventions' attributes that describe a call, not its content (v1.41.0
#    registry: gen-ai, http, url, server/client/network, rpc, error/exception, code, thread;
#    /work/shared/research/genai-semconv.md). Content keys (gen_ai.input.messages, ...system_instructions,
#    ...tool.definitions, ...tool.call.arguments/result, gen_ai.request.stop_sequences, url.query,
#    http.*.header.*, user_agent.original) are not here; nor is otel.status_description, the span
#    status's message (STATUS_MESSAGE_KEY): GenAI instrumentations write str(error) there, which for a
#    provider's error can quote the prompt.
METADATA_KEYS_SEMCONV = [
    "gen_ai.response.id", "gen_ai.conversation.id", "gen_ai.output.type", "gen_ai.request.encoding_formats",
    "gen_ai.agent.id", "gen_ai.agent.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.type",
    "gen_ai.data_source.id", "gen_ai.openai.request.service_tier", "gen_ai.openai.response.service_tier",
    "gen_ai.openai.response.system_fingerprint", "openai.request.service_tier", "openai.response.service_tier",
    "openai.response.system_fingerprint",
    "http.request.method", "http.request.method_original", "http.method", "http.scheme", "http.flavor",
    "http.host", "server.socket.address",
    "url.scheme", "url.template", "url.full", "http.url", "http.target",  # the last three reduced: no query, no userinfo
    "client.address", "network.protocol.name", "network.protocol.version", "network.transport", "network.type",
    "network.peer.address", "network.local.address", "net.peer.name", "net.host.name", "net.transport",
    "rpc.system", "rpc.service", "rpc.method", "rpc.grpc.status_code",
    "exception.type", "exception.message", "exception.stacktrace", "exception.escaped",
    "otel.status_code", "otel.scope.name", "otel.scope.version",
    "code.function", "code.namespace", "code.filepath", "code.function.name", "code.file.path",
    "thread.name",
]
# 3. Instrumentations' own descriptive keys that are not content (README's emitter table):
#    OpenInference, OpenLLMetry/Traceloop, LiteLLM, Logfire. Their content keys (llm.input_messages,
#    llm.invocation_parameters, request_data, response_data, events, raw_input, ...) are not here.
METADATA_KEYS_INSTRUMENTATIONS = [
    "openinference.span.kind", "llm.model_name", "llm.provider", "llm.system",
    "traceloop.span.kind", "traceloop.entity.name", "traceloop.workflow.name", "llm.request.type",
    "gen_ai.openai.api_base", "litellm.call_id",
    "logfire.span_type", "logfire.level_name",  # not logfire.msg / msg_template: an f-string puts anything there
    # Their resources' own keys: vLLM's (vllm/tracing/otel.py: the module, its process; workers add kind
    # and name) and LiteLLM's model_id (its service name: tests/testdata/emitters/README.md, LiteLLM 1.110.2).
    "vllm.instrumenting_module_name", "vllm.process_id", "vllm.process_kind", "vllm.process_name", "model_id",
]
# 4. The OTel resource semantic conventions' attributes (service, telemetry SDK and distro, deployment,
#    host, os, process, container, k8s, cloud, faas: https://opentelemetry.io/docs/specs/semconv/resource/),
#    which resources and scopes carry: what the process is, not what it was asked. Not here: process.command,
#    process.command_line and process.command_args (a command line can carry anything), environment
#    variables, and k8s labels and annotations (anyone's text).
METADATA_KEYS_RESOURCE = [
    "service.name", "service.namespace", "service.version", "service.instance.id",
    "telemetry.sdk.name", "telemetry.sdk.language", "telemetry.sdk.version", "telemetry.auto.version",
    "telemetry.distro.name", "telemetry.distro.version", "deployment.environment", "deployment.environment.name",
    "host.name", "host.id", "host.type", "host.arch", "host.image.name", "host.image.id", "host.image.version",
    "os.type", "os.name", "os.version", "os.description", "os.build_id",
    "process.pid", "process.parent_pid", "process.executable.name", "process.executable.path", "process.owner",
    "process.runtime.name", "process.runtime.version", "process.runtime.description",
    "container.id", "container.name", "container.runtime", "container.image.name", "container.image.id",
    "container.image.tags",
    "k8s.cluster.name", "k8s.cluster.uid", "k8s.node.name", "k8s.node.uid", "k8s.namespace.name", "k8s.pod.name",
    "k8s.pod.uid", "k8s.container.name", "k8s.container.restart_count", "k8s.deployment.name", "k8s.deployment.uid",
    "k8s.replicaset.name", "k8s.replicaset.uid", "k8s.statefulset.name", "k8s.statefulset.uid",
    "k8s.daemonset.name", "k8s.daemonset.uid", "k8s.job.name", "k8s.job.uid", "k8s.cronjob.name", "k8s.cronjob.uid",
    "cloud.provider", "cloud.platform", "cloud.region", "cloud.availability_zone", "cloud.account.id",
    "cloud.resource_id", "faas.name", "faas.version", "faas.instance", "faas.max_memory",
]
METADATA_KEYS = frozenset(METADATA_KEYS_READ + METADATA_KEYS_SEMCONV + METADATA_KEYS_INSTRUMENTATIONS
                          + METADATA_KEYS_RESOURCE)
# The key a span's Status.message is judged under, as a text attribute (the name OTel's non-OTLP
# exporters give it): not metadata, so by default it is reduced to the span's error.type or dropped.
STATUS_MESSAGE_KEY = "otel.status_description"
# The keys whose text is a URL: kept without its query, fragment and userinfo.
URL_KEYS = frozenset({"url.full", "http.url", "http.target"})



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
    # Your additions to METADATA_KEYS: keys whose text is kept and never removed by the rules above
    # (an entry with "*" is a glob, any other an exact key).
    allowed_keys: list[str] = field(default_factory=lambda: ["exception.stacktrace"])
    max_attribute_value_bytes: PositiveInt = 16 * 1024  # longer string values are truncated
    max_attributes_per_span: PositiveInt = 256  # further attributes are dropped

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_attribute_value_bytes": (1, 64 * 1024 * 1024),
        "max_attributes_per_span": (1, 100_000),
        "max_free_text_bytes": (0, 64 * 1024 * 1024),
    }
