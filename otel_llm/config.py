"""Configuration in the shape of an OpenTelemetry Collector config.

Every option is a typed dataclass field with its default; the loader walks the dataclasses, so an
unknown key or a bad value is reported with its full path (``receivers.otlp.protocols.grpc.endpoint``).
A top-level section that is absent takes its defaults; a section that is present runs only the
components it lists (a missing ``exporters.store`` means no store), as in the Collector.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml


class ConfigError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class _Duration:
    """``"10s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a number of seconds."""


class _Endpoint:
    """``host:port`` with a port in 0..65535 (0 picks a free port)."""


class _Positive:
    pass


Duration = Annotated[float, _Duration]
Endpoint = Annotated[str, _Endpoint]
PositiveInt = Annotated[int, _Positive]

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)\s*$")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


# Every integer fits a C int (gRPC channel options, struct fields on the pipes, shared memory),
# every duration is finite and far below what a timed wait accepts (threading.TIMEOUT_MAX, ~292
# years): fields with a tighter sane range are listed in ``_BOUNDS``.
MAX_INT = 2**31 - 1
MAX_DURATION_S = 10 * 365 * 86400.0


def parse_duration(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str) and (match := _DURATION.match(value)):
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        else:
            raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    except OverflowError:
        seconds = math.inf
    if math.isnan(seconds):
        raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    if seconds < 0:
        raise ConfigError(path, f"duration must not be negative, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ConfigError(path, f"duration must be finite and at most {format_duration(MAX_DURATION_S)}, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


def parse_endpoint(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(path, f"expected host:port, got {value!r}")
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(path, f"expected host:port with a port 0-65535, got {value!r}")
    if not host:
        raise ConfigError(path, f"expected host:port with a host (use 0.0.0.0 for all interfaces), got {value!r}")
    return value


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


# --- receivers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerTls:
    """TLS for a listener; both files or neither."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""  # when set, clients must present a certificate signed by it (mTLS)


@dataclass(frozen=True)
class BearerAuth:
    """``Authorization: Bearer <token>``; the token inline or, better, from a file."""

    bearer_token: str = ""
    bearer_token_file: str = ""

    def token(self) -> str:
        if self.bearer_token_file:
            return Path(self.bearer_token_file).read_text(encoding="utf-8").strip()
        return self.bearer_token


@dataclass(frozen=True)
class GrpcProtocol:
    endpoint: Endpoint = "0.0.0.0:4317"
    max_recv_msg_size_mib: PositiveInt = 4
    max_concurrent_streams: PositiveInt = 64
    workers: PositiveInt = 4  # unused since the receiver runs on grpc.aio (no thread pool); accepted for old configs
    # A call must deliver its whole request message within this; past it, it is cut (DEADLINE_EXCEEDED)
    # and counted (``read_timeout``): a call that sends only its headers holds nothing for long.
    read_timeout: Duration = 30.0
    tls: ServerTls | None = None
    auth: BearerAuth | None = None


@dataclass(frozen=True)
class HttpProtocol:
    endpoint: Endpoint = "0.0.0.0:4318"
    max_request_body_size: PositiveInt = 20 * 1024 * 1024  # bytes after decompression, as the Collector
    max_concurrent_requests: PositiveInt = 64  # requests being decoded and admitted at once (bodies already read)
    max_connections: PositiveInt = 1024  # open connections (one thread each); more are refused (counted)
    # Bodies held at once (as read, and decompressed), over all connections: the receiver process's
    # memory for requests in flight. Past it, a retryable 503 (bytes_in_flight), counted.
    max_bytes_in_flight: PositiveInt = 256 * 1024 * 1024
    read_header_timeout: Duration = 10.0  # from a request's first byte (a connection's start) to its last header
    read_timeout: Duration = 60.0  # from a request's first byte to the end of its body
    idle_timeout: Duration = 60.0  # a keep-alive connection with no request for this long is closed
    tls: ServerTls | None = None
    auth: BearerAuth | None = None


@dataclass(frozen=True)
class OtlpProtocols:
    grpc: GrpcProtocol | None = field(default_factory=GrpcProtocol)
    http: HttpProtocol | None = field(default_factory=HttpProtocol)


@dataclass(frozen=True)
class IntakeLogConfig:
    """Opt-in crash-safe intake: every admitted request is written to this log before it is
    answered, replayed at start, and deleted once handled (``otel_llm/receiver/otlp/intake_log.py``).
    A process crash (SIGKILL, OOM kill) then loses nothing acknowledged under any ``fsync``; the
    policy sets what a machine crash loses: ``always`` nothing (the answer waits for fdatasync),
    ``interval`` up to ``fsync_interval``, ``never`` what the kernel had not written back."""

    directory: str = ""  # default: <exporters.store.path>/intake-log
    fsync: str = "interval"  # always | interval | never
    fsync_interval: Duration = 1.0
    max_size_mib: PositiveInt = 1024  # past it, requests are refused retryably (intake_log_full), counted
    segment_size_mib: PositiveInt = 16  # the unit of deletion


@dataclass(frozen=True)
class OtlpReceiver:
    protocols: OtlpProtocols = field(default_factory=OtlpProtocols)
    # Spans accepted but not yet processed; past it, exports are refused with a retry hint.
    max_queued_spans: PositiveInt = 200_000
    intake_log: IntakeLogConfig | None = None  # off unless listed


@dataclass(frozen=True)
class Receivers:
    otlp: OtlpReceiver | None = field(default_factory=OtlpReceiver)


# --- processors ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Namings:
    vllm: bool = True
    gen_ai: bool = True


@dataclass(frozen=True)
class ResourceModelRuleConfig:
    attribute: str = "service.name"
    values: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelNameConfig:
    from_resource: list[ResourceModelRuleConfig] = field(default_factory=list)
    default: str = ""  # empty: no model label value is made up


@dataclass(frozen=True)
class DimensionConfig:
    name: str = ""
    attribute: str = ""
    values: list[str] = field(default_factory=list)
    other: str = "other"


@dataclass(frozen=True)
class EdgeTtftConfig:
    attributes: list[str] = field(default_factory=lambda: ["gen_ai.server.time_to_first_token"])
    events: list[str] = field(default_factory=lambda: ["gen_ai.first_token", "first_token"])


@dataclass(frozen=True)
class LlmMetricsProcessor:
    namings: Namings = field(default_factory=Namings)
    max_model_len: PositiveInt = 131072
    series_limit: PositiveInt = 2000
    default_operation_name: str = "chat"
    max_latency: Duration = 86400.0
    model_name: ModelNameConfig = field(default_factory=ModelNameConfig)
    dimensions: list[DimensionConfig] = field(default_factory=list)
    edge_time_to_first_token: EdgeTtftConfig = field(default_factory=EdgeTtftConfig)


@dataclass(frozen=True)
class SloPolicyConfig:
    thresholds: dict[str, Duration] = field(default_factory=dict)  # metric -> limit: ttft, tpot, e2e, queue, gateway_overhead
    per_model: dict[str, dict[str, Duration]] = field(default_factory=dict)


@dataclass(frozen=True)
class SlowestPolicyConfig:
    metrics: list[str] = field(default_factory=lambda: ["ttft", "e2e"])
    quantile: float = 0.99
    window: Duration = 600.0


@dataclass(frozen=True)
class ProbabilisticPolicyConfig:
    sampling_percentage: float = 1.0


@dataclass(frozen=True)
class PolicyConfig:
    name: str = ""
    type: str = ""  # errors | slo | slowest | probabilistic
    slo: SloPolicyConfig | None = None
    slowest: SlowestPolicyConfig | None = None
    probabilistic: ProbabilisticPolicyConfig | None = None


def default_policies() -> list[PolicyConfig]:
    """Every error and abort, every request above its model's rolling p99 of TTFT or e2e, a 1 % baseline."""
    return [
        PolicyConfig(name="errors", type="errors"),
        PolicyConfig(name="slowest", type="slowest", slowest=SlowestPolicyConfig()),
        PolicyConfig(name="baseline", type="probabilistic", probabilistic=ProbabilisticPolicyConfig()),
    ]


@dataclass(frozen=True)
class RateLimitConfig:
    traces_per_second: float = 0.0  # 0 = unlimited
    per_model_traces_per_second: float = 0.0
    applies_to: list[str] = field(default_factory=list)  # policy names; empty = every policy but errors


@dataclass(frozen=True)
class TailSamplingProcessor:
    decision_wait: Duration = 10.0
    grace: Duration = 1.0
    num_traces: PositiveInt = 50_000
    max_spans_per_trace: PositiveInt = 10_000
    decision_cache_size: PositiveInt = 100_000
    policies: list[PolicyConfig] = field(default_factory=default_policies)
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)


@dataclass(frozen=True)
class MemoryLimiterProcessor:
    """As the Collector's memory_limiter: refuse data (retryably) above ``limit - spike`` RSS."""

    check_interval: Duration = 1.0
    limit_mib: int = 0  # 0: limit_percentage of the cgroup limit or of physical memory
    spike_limit_mib: int = 0  # 0: 20 % of the limit
    limit_percentage: float = 80.0


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


@dataclass(frozen=True)
class Processors:
    llm_metrics: LlmMetricsProcessor = field(default_factory=LlmMetricsProcessor)
    tail_sampling: TailSamplingProcessor = field(default_factory=TailSamplingProcessor)
    memory_limiter: MemoryLimiterProcessor = field(default_factory=MemoryLimiterProcessor)
    redaction: RedactionProcessor = field(default_factory=RedactionProcessor)


# --- exporters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusExporter:
    endpoint: Endpoint = "0.0.0.0:9464"  # bind 127.0.0.1:9464 to keep /metrics and /api on loopback
    auth: BearerAuth | None = None  # required on /metrics and /api/*; /healthz and /readyz stay open


@dataclass(frozen=True)
class StoreExporter:
    path: str = "./otel-llm-data"
    retention: Duration = 86400.0  # kept traces older than this are deleted
    max_size_mib: PositiveInt = 1024  # past this the oldest traces are deleted
    queue_size: PositiveInt = 10_000  # kept traces waiting for the writer
    max_block: Duration = 5.0  # when the queue is full, how long a decision waits before the trace is dropped
    commit_interval: Duration = 0.1  # a kept trace waits at most this for more to share its transaction


@dataclass(frozen=True)
class RetryOnFailure:
    enabled: bool = True
    initial_interval: Duration = 1.0
    max_interval: Duration = 30.0
    max_elapsed_time: Duration = 300.0  # 0 = retry forever
    multiplier: float = 1.5


@dataclass(frozen=True)
class SendingQueue:
    enabled: bool = True
    num_consumers: PositiveInt = 2
    queue_size: PositiveInt = 1000  # export requests (batches of kept spans) held in memory
    storage: str = ""  # a directory: the queue is also written there and replayed after a restart
    batch_max_spans: PositiveInt = 2048  # kept traces are batched into requests of about this many spans
    batch_timeout: Duration = 0.2  # ... or sent after this long, whichever comes first


@dataclass(frozen=True)
class ClientTls:
    insecure: bool = True
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""


@dataclass(frozen=True)
class OtlpTraceExporter:
    """Kept traces out over OTLP/gRPC (``exporters.otlp``) or OTLP/HTTP (``exporters.otlphttp``)."""

    endpoint: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout: Duration = 10.0
    compression: str = "gzip"
    tls: ClientTls = field(default_factory=ClientTls)
    retry_on_failure: RetryOnFailure = field(default_factory=RetryOnFailure)
    sending_queue: SendingQueue = field(default_factory=SendingQueue)


@dataclass(frozen=True)
class MetricsSendingQueue:
    # Snapshots waiting to be exported; a full queue drops its oldest (the next export carries its
    # data: totals when cumulative, the difference from the last success when delta).
    queue_size: PositiveInt = 10


@dataclass(frozen=True)
class OtlpMetricsExporter:
    """Both namings pushed as OTLP metrics (``exporters.otlp_metrics``, otel_llm/exporter/otlp_metrics/exporter.py)."""

    protocol: str = "grpc"  # grpc | http
    endpoint: str = ""  # default localhost:4317 (grpc), http://localhost:4318 (http; /v1/metrics appended)
    headers: dict[str, str] = field(default_factory=dict)
    timeout: Duration = 10.0  # per attempt (the SDK exporter's own retries of transient errors included)
    compression: str = "gzip"
    tls: ClientTls = field(default_factory=ClientTls)
    interval: Duration = 15.0
    temporality: str = "cumulative"  # cumulative | delta
    resource_attributes: dict[str, str] = field(default_factory=dict)  # beside service.name=otel-llm
    retry_on_failure: RetryOnFailure = field(default_factory=RetryOnFailure)
    sending_queue: MetricsSendingQueue = field(default_factory=MetricsSendingQueue)


METRICS_EXPORTERS = ("otlp_metrics",)  # the exporters of service.pipelines.metrics; every other is a traces one


@dataclass(frozen=True)
class Exporters:
    prometheus: PrometheusExporter | None = field(default_factory=PrometheusExporter)
    store: StoreExporter | None = field(default_factory=StoreExporter)
    otlp: OtlpTraceExporter | None = None
    otlphttp: OtlpTraceExporter | None = None
    otlp_metrics: OtlpMetricsExporter | None = None


# --- service ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracesPipeline:
    receivers: list[str] = field(default_factory=list)
    processors: list[str] = field(default_factory=list)
    exporters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MetricsPipeline:
    # The metrics come from processors.llm_metrics (there is no metrics receiver), so only exporters.
    exporters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pipelines:
    traces: TracesPipeline | None = None
    metrics: MetricsPipeline | None = None


@dataclass(frozen=True)
class Service:
    pipelines: Pipelines = field(default_factory=Pipelines)
    shutdown_grace: Duration = 30.0
    # The engine adapters in a process of their own: the per-span work on two cores (36 000-40 000
    # instead of ~22 000 spans/s at saturation on 2 cores), for ~1-2 ms more Export p99 there
    # (bench/README.md).
    adapter_process: bool = False


@dataclass(frozen=True)
class Config:
    receivers: Receivers = field(default_factory=Receivers)
    processors: Processors = field(default_factory=Processors)
    exporters: Exporters = field(default_factory=Exporters)
    service: Service = field(default_factory=Service)


# --- loading ---------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *markers = typing.get_args(tp)
        if _Duration in markers:
            return parse_duration(value, path)
        if _Endpoint in markers:
            return parse_endpoint(value, path)
        converted = _convert(base, value, path)
        if _Positive in markers and converted <= 0:
            raise ConfigError(path, f"must be a positive integer, got {value!r}")
        return converted
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            # An explicitly empty component (`http:` with no body) means "on, with defaults".
            return _convert(args[0], {}, path) if dataclasses.is_dataclass(args[0]) else None
        return _convert(args[0], value, path)
    if dataclasses.is_dataclass(tp):
        return load_dataclass(tp, value, path)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {value!r}")
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        return {str(k): _convert(item, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(path, f"expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return str(value)
    raise ConfigError(path, f"unsupported type {_type_name(tp)}")


def load_dataclass(cls: Any, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise ConfigError(key_path, f"unknown key; expected one of: {', '.join(names)}")
        kwargs[key] = _convert(hints[key], value, key_path)
        _check_bounds(cls, key, hints[key], kwargs[key], value, key_path)
    return cls(**kwargs)


def _check_bounds(cls: Any, key: str, tp: Any, converted: Any, raw: Any, path: str) -> None:
    bound = _BOUNDS.get((cls, key))
    if bound is None:
        if isinstance(converted, int) and not isinstance(converted, bool) and not -MAX_INT - 1 <= converted <= MAX_INT:
            raise ConfigError(path, f"must be at most {MAX_INT}, got {raw!r}")
        return
    low, high = bound
    if not low <= converted <= high:
        if _Duration in typing.get_args(tp):
            low_text, high_text = format_duration(low) if low else "0", format_duration(high)
        else:
            low_text, high_text = (f"{int(n)}" if float(n).is_integer() else f"{n:g}" for n in (low, high))
        raise ConfigError(path, f"must be between {low_text} and {high_text}, got {raw!r}")



# Sane ranges, inclusive, checked as each field loads (durations in seconds). A value outside
# breaks something at run time: a C int or a shared int64 that wraps, a busy loop, a timed wait
# that raises, a thread per unit, or memory without bound.
_BOUNDS: dict[tuple[type, str], tuple[float, float]] = {
    (GrpcProtocol, "max_recv_msg_size_mib"): (1, 2047),  # bytes go into a C int grpc option
    (GrpcProtocol, "max_concurrent_streams"): (1, 100_000),
    (GrpcProtocol, "workers"): (1, 1024),
    (HttpProtocol, "max_request_body_size"): (1, MAX_INT),
    (HttpProtocol, "max_concurrent_requests"): (1, 100_000),
    (HttpProtocol, "max_bytes_in_flight"): (1024, MAX_INT),
    (HttpProtocol, "max_connections"): (1, 100_000),  # a thread each
    (OtlpReceiver, "max_queued_spans"): (1, 100_000_000),  # a shared int64 beside byte counts
    (LlmMetricsProcessor, "max_model_len"): (1, 1 << 30),
    (LlmMetricsProcessor, "series_limit"): (1, 10_000_000),
    (LlmMetricsProcessor, "max_latency"): (0.001, 365 * 86400.0),
    (SlowestPolicyConfig, "window"): (0.001, 30 * 86400.0),
    (TailSamplingProcessor, "decision_wait"): (0.0, 86400.0),
    (TailSamplingProcessor, "grace"): (0.0, 86400.0),
    (TailSamplingProcessor, "num_traces"): (1, 10_000_000),
    (TailSamplingProcessor, "max_spans_per_trace"): (1, 10_000_000),
    (TailSamplingProcessor, "decision_cache_size"): (1, 100_000_000),
    (RateLimitConfig, "traces_per_second"): (0.0, 1_000_000.0),
    (RateLimitConfig, "per_model_traces_per_second"): (0.0, 1_000_000.0),
    (MemoryLimiterProcessor, "check_interval"): (0.01, 600.0),  # 0 is a busy loop
    (MemoryLimiterProcessor, "limit_mib"): (0, 1 << 22),  # 4 TiB; in bytes into a shared int64
    (MemoryLimiterProcessor, "spike_limit_mib"): (0, 1 << 22),
    (RedactionProcessor, "max_attribute_value_bytes"): (1, 64 * 1024 * 1024),
    (RedactionProcessor, "max_attributes_per_span"): (1, 100_000),
    (RedactionProcessor, "max_free_text_bytes"): (0, 64 * 1024 * 1024),
    (StoreExporter, "retention"): (0.0, 3650 * 86400.0),
    (StoreExporter, "max_size_mib"): (1, 1 << 24),  # 16 TiB
    (StoreExporter, "queue_size"): (1, 10_000_000),
    (StoreExporter, "max_block"): (0.0, 600.0),
    (StoreExporter, "commit_interval"): (0.0, 10.0),
    (RetryOnFailure, "initial_interval"): (0.001, 3600.0),  # 0 would retry in a busy loop
    (RetryOnFailure, "max_interval"): (0.001, 86400.0),
    (RetryOnFailure, "max_elapsed_time"): (0.0, 7 * 86400.0),
    (RetryOnFailure, "multiplier"): (1.0, 100.0),
    (SendingQueue, "num_consumers"): (1, 1024),  # one thread each
    (SendingQueue, "queue_size"): (1, 10_000_000),
    (SendingQueue, "batch_max_spans"): (1, 10_000_000),
    (SendingQueue, "batch_timeout"): (0.0, 600.0),
    (OtlpTraceExporter, "timeout"): (0.0, 3600.0),
    (OtlpMetricsExporter, "timeout"): (0.001, 3600.0),  # 0 would make the SDK fall back to its own default
    (OtlpMetricsExporter, "interval"): (0.1, 86400.0),  # a snapshot of every family each time
    (MetricsSendingQueue, "queue_size"): (1, 10_000),  # snapshots: every series of every family each
    (Service, "shutdown_grace"): (0.0, 3600.0),
}


def _validate(config: Config) -> None:
    metrics = config.processors.llm_metrics
    seen: set[str] = set()
    reserved: set[str] = set()
    for i, dim in enumerate(metrics.dimensions):
        path = f"processors.llm_metrics.dimensions[{i}]"
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", dim.name):
            raise ConfigError(f"{path}.name", f"must be a Prometheus label name, got {dim.name!r}")
        if dim.name in seen:
            raise ConfigError(f"{path}.name", f"duplicate dimension {dim.name!r}")
        if dim.name.startswith("__") or dim.name in (reserved := reserved or _reserved_label_names()):
            raise ConfigError(f"{path}.name",
                              f"{dim.name!r} is a label the metrics have already (or Prometheus reserves)")
        seen.add(dim.name)
        if not dim.attribute:
            raise ConfigError(f"{path}.attribute", "required")
        if not dim.values:
            raise ConfigError(f"{path}.values", "required: the allow-list of label values (anything else becomes 'other')")
    _validate_security(config)
    _validate_intake_log(config)
    _validate_receiver_timeouts(config)
    limiter = config.processors.memory_limiter
    if limiter.limit_mib < 0 or limiter.spike_limit_mib < 0:
        raise ConfigError("processors.memory_limiter", "limits must not be negative")
    if limiter.limit_mib and limiter.spike_limit_mib >= limiter.limit_mib:
        raise ConfigError("processors.memory_limiter.spike_limit_mib", "must be below limit_mib")
    if not 0 < limiter.limit_percentage <= 100:
        raise ConfigError("processors.memory_limiter.limit_percentage", "must be in (0, 100]")
    for name in ("otlp", "otlphttp"):
        exporter = getattr(config.exporters, name)
        if exporter is None:
            continue
        path = f"exporters.{name}"
        if not exporter.endpoint:
            raise ConfigError(f"{path}.endpoint", "required (e.g. tempo:4317 for otlp, http://tempo:4318 for otlphttp)")
        if name == "otlphttp" and not exporter.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{path}.endpoint", f"expected an http:// or https:// URL, got {exporter.endpoint!r}")
        if name == "otlphttp":
            _check_url(exporter.endpoint, f"{path}.endpoint")
        _check_headers(exporter.headers, f"{path}.headers", grpc=name == "otlp")
        if name == "otlp":
            _check_grpc_target(exporter.endpoint, f"{path}.endpoint")
        _check_client_tls(exporter.tls, f"{path}.tls")
        if exporter.compression not in ("gzip", "none", ""):
            raise ConfigError(f"{path}.compression", f"expected gzip or none, got {exporter.compression!r}")
        retry = exporter.retry_on_failure
        if retry.multiplier < 1:
            raise ConfigError(f"{path}.retry_on_failure.multiplier", "must be >= 1")
        if retry.initial_interval > retry.max_interval:
            raise ConfigError(f"{path}.retry_on_failure.initial_interval", "must not exceed max_interval")
    _validate_metrics_exporter(config)
    sampling = config.processors.tail_sampling
    _validate_policies(sampling)
    if sampling.grace > sampling.decision_wait:
        raise ConfigError("processors.tail_sampling.grace", "must not exceed decision_wait")
    pipeline = config.service.pipelines.traces
    if pipeline is not None:
        known = {
            "receivers": {f.name for f in dataclasses.fields(Receivers) if getattr(config.receivers, f.name) is not None},
            "processors": {f.name for f in dataclasses.fields(Processors)},
            "exporters": {f.name for f in dataclasses.fields(Exporters)
                          if getattr(config.exporters, f.name) is not None and f.name not in METRICS_EXPORTERS},
        }
        for kind, names in known.items():
            for i, name in enumerate(getattr(pipeline, kind)):
                if name not in names:
                    raise ConfigError(f"service.pipelines.traces.{kind}[{i}]",
                                      f"{name!r} is not configured under {kind} (have: {', '.join(sorted(names)) or 'none'})")
    endpoints: dict[str, str] = {}
    for path, endpoint in _listen_endpoints(config):
        if endpoint in endpoints and not endpoint.endswith(":0"):
            raise ConfigError(path, f"{endpoint} is already used by {endpoints[endpoint]}")
        endpoints[endpoint] = path


def _validate_metrics_exporter(config: Config) -> None:
    pipelines = config.service.pipelines
    if pipelines.traces is not None:
        for i, name in enumerate(pipelines.traces.exporters):
            if name in METRICS_EXPORTERS:
                raise ConfigError(f"service.pipelines.traces.exporters[{i}]",
                                  f"{name!r} is a metrics exporter: list it in service.pipelines.metrics.exporters")
    configured = {name for name in METRICS_EXPORTERS if getattr(config.exporters, name) is not None}
    if pipelines.metrics is not None:
        for i, name in enumerate(pipelines.metrics.exporters):
            if name not in configured:
                raise ConfigError(f"service.pipelines.metrics.exporters[{i}]",
                                  f"{name!r} is not a configured metrics exporter "
                                  f"(have: {', '.join(sorted(configured)) or 'none'})")
    if pipelines.traces is not None or pipelines.metrics is not None:
        # With pipelines, only listed components run: one in no pipeline would be accepted and ignored.
        listed = set(pipelines.metrics.exporters) if pipelines.metrics is not None else set()
        for name in sorted(configured - listed):
            raise ConfigError(f"exporters.{name}", "configured but in no pipeline, so it would not run: list it in "
                                                   "service.pipelines.metrics.exporters (or remove it)")
    exporter = config.exporters.otlp_metrics
    if exporter is None:
        return
    path = "exporters.otlp_metrics"
    if exporter.protocol not in ("grpc", "http"):
        raise ConfigError(f"{path}.protocol", f"expected grpc or http, got {exporter.protocol!r}")
    if exporter.temporality not in ("cumulative", "delta"):
        raise ConfigError(f"{path}.temporality", f"expected cumulative or delta, got {exporter.temporality!r}")
    if exporter.compression not in ("gzip", "none", ""):
        raise ConfigError(f"{path}.compression", f"expected gzip or none, got {exporter.compression!r}")
    if exporter.endpoint:
        if exporter.protocol == "http":
            if not exporter.endpoint.startswith(("http://", "https://")):
                raise ConfigError(f"{path}.endpoint", f"expected an http:// or https:// URL, got {exporter.endpoint!r}")
            _check_url(exporter.endpoint, f"{path}.endpoint")
        else:
            _check_grpc_target(exporter.endpoint, f"{path}.endpoint")
    _check_headers(exporter.headers, f"{path}.headers", grpc=exporter.protocol == "grpc")
    _check_client_tls(exporter.tls, f"{path}.tls")
    for key in exporter.resource_attributes:
        if not key:
            raise ConfigError(f"{path}.resource_attributes", "an attribute name must not be empty")
    retry = exporter.retry_on_failure
    if retry.initial_interval > retry.max_interval:
        raise ConfigError(f"{path}.retry_on_failure.initial_interval", "must not exceed max_interval")


_HTTP_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_GRPC_KEY = re.compile(r"[0-9a-z_.-]+")


def _check_url(url: str, path: str) -> None:
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in 0-65535
    except ValueError as exc:
        raise ConfigError(path, f"expected http(s)://host[:port][/path], got {url!r}: {exc}") from None
    if not parts.hostname:
        raise ConfigError(path, f"expected http(s)://host[:port][/path], got {url!r}: no host")


def _check_grpc_target(endpoint: str, path: str) -> None:
    """An OTLP/gRPC exporter's endpoint: host:port, optionally behind http:// or https://."""
    scheme, sep, rest = endpoint.partition("://")
    if sep and scheme not in ("http", "https"):
        raise ConfigError(path, f"expected host:port or http(s)://host:port, got {endpoint!r}")
    parse_endpoint(rest if sep else endpoint, path)


def _check_client_tls(tls: Any, path: str) -> None:
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError(path, "cert_file and key_file go together (client certificate)")
    for key in ("ca_file", "cert_file", "key_file"):
        file = getattr(tls, key)
        if file and not Path(file).is_file():
            raise ConfigError(f"{path}.{key}", f"no such file: {file}")


def _check_headers(headers: dict[str, str], path: str, grpc: bool) -> None:
    """What the transport will send, checked now: a bad name or value fails every export otherwise."""
    for key, value in headers.items():
        if not (_GRPC_KEY.fullmatch(key.lower()) if grpc else _HTTP_TOKEN.fullmatch(key)):
            allowed = "letters, digits, '-', '_' and '.'" if grpc else "an HTTP token (no spaces or separators)"
            raise ConfigError(f"{path}.{key}", f"not a valid header name: {allowed}")
        if grpc and not key.lower().endswith("-bin"):
            bad = next((c for c in value if not 32 <= ord(c) < 127), None)
        else:
            bad = next((c for c in value if (ord(c) < 32 and c != "\t") or ord(c) == 127 or ord(c) > 255), None)
        if bad is not None:
            raise ConfigError(f"{path}.{key}", f"the value contains {bad!r}, which a header cannot carry")


def _reserved_label_names() -> set[str]:
    """Label names the metric namings use already, and Prometheus's own: a dimension named like one
    would give series with a duplicate label, which Prometheus rejects with the whole scrape."""
    from otel_llm.processor.llm_metrics.metrics import definitions

    names = {"le", "quantile", "segment", "finished_reason"}
    for factory in ("genai_naming", "genai_client_naming", "own_naming"):
        if hasattr(definitions, factory):
            names.update(definitions.prometheus_label_name(n) for n in getattr(definitions, factory)().label_names)
    names.update(definitions.prometheus_label_name(n) for n in definitions.vllm_naming(1).label_names)
    return names


def _validate_security(config: Config) -> None:
    places: list[tuple[str, ServerTls | None, BearerAuth | None]] = []
    otlp = config.receivers.otlp
    if otlp is not None:
        for name in ("grpc", "http"):
            protocol = getattr(otlp.protocols, name)
            if protocol is not None:
                places.append((f"receivers.otlp.protocols.{name}", protocol.tls, protocol.auth))
    if config.exporters.prometheus is not None:
        places.append(("exporters.prometheus", None, config.exporters.prometheus.auth))
    for path, tls, auth in places:
        if tls is not None:
            if not tls.cert_file or not tls.key_file:
                raise ConfigError(f"{path}.tls", "cert_file and key_file are both required")
            for key in ("cert_file", "key_file", "client_ca_file"):
                file = getattr(tls, key)
                if file and not Path(file).is_file():
                    raise ConfigError(f"{path}.tls.{key}", f"no such file: {file}")
        if auth is not None:
            if bool(auth.bearer_token) == bool(auth.bearer_token_file):
                raise ConfigError(f"{path}.auth", "set exactly one of bearer_token or bearer_token_file")
            try:
                token = auth.token()
            except OSError as exc:
                raise ConfigError(f"{path}.auth.bearer_token_file", f"cannot read: {exc.strerror or exc}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"{path}.auth.bearer_token_file", "not UTF-8 text") from None
            if not token:
                raise ConfigError(f"{path}.auth", "the token is empty")


def _validate_receiver_timeouts(config: Config) -> None:
    otlp = config.receivers.otlp
    if otlp is None:
        return
    checks: list[tuple[str, float]] = []
    if otlp.protocols.grpc is not None:
        checks.append(("grpc.read_timeout", otlp.protocols.grpc.read_timeout))
    http = otlp.protocols.http
    if http is not None:
        checks += [("http.read_header_timeout", http.read_header_timeout), ("http.read_timeout", http.read_timeout),
                   ("http.idle_timeout", http.idle_timeout)]
    for key, seconds in checks:
        # 0 would cut every request, .inf would be no deadline at all: neither is a setting.
        if not 0.001 <= seconds <= 86_400:
            raise ConfigError(f"receivers.otlp.protocols.{key}", f"must be between 1ms and 24h, got {seconds!r}")
    if http is not None and http.read_header_timeout > http.read_timeout:
        raise ConfigError("receivers.otlp.protocols.http.read_header_timeout", "must not exceed read_timeout")


def intake_log_directory(config: Config) -> str:
    """Where ``receivers.otlp.intake_log`` lives: its ``directory``, else beside the store."""
    otlp = config.receivers.otlp
    if otlp is None or otlp.intake_log is None:
        return ""
    if otlp.intake_log.directory:
        return otlp.intake_log.directory
    store = config.exporters.store
    return str(Path(store.path) / "intake-log") if store is not None else ""


def _validate_intake_log(config: Config) -> None:
    otlp = config.receivers.otlp
    settings = otlp.intake_log if otlp is not None else None
    if settings is None:
        return
    path = "receivers.otlp.intake_log"
    if settings.fsync not in ("always", "interval", "never"):
        raise ConfigError(f"{path}.fsync", f"expected always, interval or never, got {settings.fsync!r}")
    if not 0.001 <= settings.fsync_interval <= 3600:
        raise ConfigError(f"{path}.fsync_interval", f"must be between 1ms and 1h, got {settings.fsync_interval!r}")
    if settings.max_size_mib > 1 << 30:
        raise ConfigError(f"{path}.max_size_mib", f"must be at most {1 << 30}, got {settings.max_size_mib}")
    if settings.segment_size_mib * 2 > settings.max_size_mib:
        raise ConfigError(f"{path}.segment_size_mib", "must be at most half of max_size_mib (segments are deleted whole)")
    if not intake_log_directory(config):
        raise ConfigError(f"{path}.directory", "required when there is no exporters.store (its default is beside the store)")


_POLICY_METRICS = ("ttft", "tpot", "e2e", "queue", "gateway_overhead")


def _validate_policies(sampling: TailSamplingProcessor) -> None:
    names: set[str] = set()
    for i, policy in enumerate(sampling.policies):
        path = f"processors.tail_sampling.policies[{i}]"
        if not policy.name:
            raise ConfigError(f"{path}.name", "required")
        if policy.name in names:
            raise ConfigError(f"{path}.name", f"duplicate policy name {policy.name!r}")
        names.add(policy.name)
        if policy.type not in ("errors", "slo", "slowest", "probabilistic"):
            raise ConfigError(f"{path}.type", f"expected errors, slo, slowest or probabilistic, got {policy.type!r}")
        block = getattr(policy, policy.type, None) if policy.type != "errors" else None
        if policy.type == "slo":
            if block is None or not (block.thresholds or block.per_model):
                raise ConfigError(f"{path}.slo.thresholds", "required: e.g. {ttft: 2s, e2e: 30s}")
            for key in list(block.thresholds) + [m for limits in block.per_model.values() for m in limits]:
                if key not in _POLICY_METRICS:
                    raise ConfigError(f"{path}.slo", f"unknown metric {key!r}; expected one of {', '.join(_POLICY_METRICS)}")
        elif policy.type == "slowest":
            block = block or SlowestPolicyConfig()
            if not 0 < block.quantile < 1:
                raise ConfigError(f"{path}.slowest.quantile", f"must be between 0 and 1, got {block.quantile}")
            for metric in block.metrics:
                if metric not in _POLICY_METRICS:
                    raise ConfigError(f"{path}.slowest.metrics", f"unknown metric {metric!r}")
            if block.window <= 0:
                raise ConfigError(f"{path}.slowest.window", "must be positive")
        elif policy.type == "probabilistic":
            percentage = (block or ProbabilisticPolicyConfig()).sampling_percentage
            if not 0 <= percentage <= 100:
                raise ConfigError(f"{path}.probabilistic.sampling_percentage", f"must be 0-100, got {percentage}")
    for i, name in enumerate(sampling.rate_limit.applies_to):
        if name not in names:
            raise ConfigError(f"processors.tail_sampling.rate_limit.applies_to[{i}]", f"no policy named {name!r}")
    if sampling.rate_limit.traces_per_second < 0 or sampling.rate_limit.per_model_traces_per_second < 0:
        raise ConfigError("processors.tail_sampling.rate_limit", "rates must not be negative")


def _listen_endpoints(config: Config) -> list[tuple[str, str]]:
    out = []
    otlp = config.receivers.otlp
    if otlp is not None:
        if otlp.protocols.grpc is not None:
            out.append(("receivers.otlp.protocols.grpc.endpoint", otlp.protocols.grpc.endpoint))
        if otlp.protocols.http is not None:
            out.append(("receivers.otlp.protocols.http.endpoint", otlp.protocols.http.endpoint))
    if config.exporters.prometheus is not None:
        out.append(("exporters.prometheus.endpoint", config.exporters.prometheus.endpoint))
    return out


def config_from_dict(data: Any) -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("", f"the config must be a mapping, got {type(data).__name__}")
    config: Config = load_dataclass(Config, {k: v for k, v in data.items() if k not in ("receivers", "exporters")}, "")
    for section, cls in (("receivers", Receivers), ("exporters", Exporters)):
        if section not in data:
            continue
        raw = data[section]
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(section, f"expected a mapping, got {raw!r}")
        loaded = load_dataclass(cls, raw, section)
        # Components the section does not list are off.
        loaded = dataclasses.replace(loaded, **{f.name: None for f in dataclasses.fields(cls) if f.name not in raw})
        config = dataclasses.replace(config, **{section: loaded})
    otlp_raw = (data.get("receivers") or {}).get("otlp") if isinstance(data.get("receivers"), dict) else None
    if isinstance(otlp_raw, dict) and isinstance(otlp_raw.get("protocols"), dict) and config.receivers.otlp is not None:
        listed = otlp_raw["protocols"]
        protocols = config.receivers.otlp.protocols
        protocols = dataclasses.replace(protocols, grpc=protocols.grpc if "grpc" in listed else None,
                                        http=protocols.http if "http" in listed else None)
        otlp = dataclasses.replace(config.receivers.otlp, protocols=protocols)
        config = dataclasses.replace(config, receivers=dataclasses.replace(config.receivers, otlp=otlp))
    _validate(config)
    return config


def _tls_places(config: Config) -> list[tuple[str, str, str, str]]:
    """(path, cert_file, key_file, CA file) of every TLS setting."""
    places: list[tuple[str, str, str, str]] = []
    otlp = config.receivers.otlp
    if otlp is not None:
        for name in ("grpc", "http"):
            protocol = getattr(otlp.protocols, name)
            if protocol is not None and protocol.tls is not None:
                tls = protocol.tls
                places.append((f"receivers.otlp.protocols.{name}.tls", tls.cert_file, tls.key_file, tls.client_ca_file))
    for name in ("otlp", "otlphttp", "otlp_metrics"):
        exporter = getattr(config.exporters, name)
        if exporter is not None:
            tls = exporter.tls
            places.append((f"exporters.{name}.tls", tls.cert_file, tls.key_file, tls.ca_file))
    return places


def _no_passphrase() -> bytes:
    raise ValueError("the private key is encrypted; otel-llm needs it unencrypted")


def check_certificates(config: Config) -> None:
    """Load every certificate, key and CA file as the listeners and exporters will, so a key that
    does not match its certificate, or a file that is not PEM, is reported with its path before
    anything starts (``validate``) instead of as a listener that cannot start (``serve``)."""
    import ssl

    for path, cert_file, key_file, ca_file in _tls_places(config):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if cert_file and key_file:
            try:
                context.load_cert_chain(cert_file, key_file, password=_no_passphrase)
            except ssl.SSLError as exc:
                if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
                    message = f"the private key {key_file} does not match the certificate {cert_file}"
                else:
                    message = f"cannot load the certificate {cert_file} with the key {key_file}: {exc.reason or exc}"
                raise ConfigError(path, message) from None
            except ValueError as exc:
                raise ConfigError(f"{path}.key_file", str(exc)) from None
            except OSError as exc:
                raise ConfigError(path, f"cannot read {cert_file} or {key_file}: {exc.strerror or exc}") from None
        if ca_file:
            key = "client_ca_file" if path.startswith("receivers.") else "ca_file"
            try:
                context.load_verify_locations(cafile=ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ConfigError(f"{path}.{key}", f"cannot load {ca_file} as PEM certificates: "
                                                   f"{getattr(exc, 'reason', None) or exc}") from None


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return config_from_dict({})
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start:exc.start + 1]
        raise ConfigError("", f"{path} is not UTF-8 text (byte {exc.start}: {byte!r})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{path} is not valid YAML: {exc}") from None
    return config_from_dict(data)
