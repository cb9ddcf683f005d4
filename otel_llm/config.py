"""Configuration in the shape of an OpenTelemetry Collector config.

Every option is a typed dataclass field with its default; the loader walks the dataclasses, so an
unknown key or a bad value is reported with its full path (``receivers.otlp.protocols.grpc.endpoint``).
A top-level section that is absent takes its defaults; a section that is present runs only the
components it lists (a missing ``exporters.store`` means no store), as in the Collector.
"""

from __future__ import annotations

import dataclasses
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


def parse_duration(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    else:
        raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    if seconds < 0:
        raise ConfigError(path, f"duration must not be negative, got {value!r}")
    return seconds


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
class GrpcProtocol:
    endpoint: Endpoint = "0.0.0.0:4317"
    max_recv_msg_size_mib: PositiveInt = 4
    max_concurrent_streams: PositiveInt = 64
    workers: PositiveInt = 4


@dataclass(frozen=True)
class HttpProtocol:
    endpoint: Endpoint = "0.0.0.0:4318"
    max_request_body_size: PositiveInt = 20 * 1024 * 1024  # bytes after decompression, as the Collector


@dataclass(frozen=True)
class OtlpProtocols:
    grpc: GrpcProtocol | None = field(default_factory=GrpcProtocol)
    http: HttpProtocol | None = field(default_factory=HttpProtocol)


@dataclass(frozen=True)
class OtlpReceiver:
    protocols: OtlpProtocols = field(default_factory=OtlpProtocols)


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
    default: str = "unknown"


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
class TailSamplingProcessor:
    decision_wait: Duration = 10.0
    grace: Duration = 1.0
    num_traces: PositiveInt = 50_000
    max_spans_per_trace: PositiveInt = 10_000
    decision_cache_size: PositiveInt = 100_000


@dataclass(frozen=True)
class Processors:
    llm_metrics: LlmMetricsProcessor = field(default_factory=LlmMetricsProcessor)
    tail_sampling: TailSamplingProcessor = field(default_factory=TailSamplingProcessor)


# --- exporters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusExporter:
    endpoint: Endpoint = "0.0.0.0:9464"


@dataclass(frozen=True)
class StoreExporter:
    path: str = "./otel-llm-data"


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
class Exporters:
    prometheus: PrometheusExporter | None = field(default_factory=PrometheusExporter)
    store: StoreExporter | None = field(default_factory=StoreExporter)
    otlp: OtlpTraceExporter | None = None
    otlphttp: OtlpTraceExporter | None = None


# --- service ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracesPipeline:
    receivers: list[str] = field(default_factory=list)
    processors: list[str] = field(default_factory=list)
    exporters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pipelines:
    traces: TracesPipeline | None = None


@dataclass(frozen=True)
class Service:
    pipelines: Pipelines = field(default_factory=Pipelines)
    shutdown_grace: Duration = 30.0


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
        return float(value)
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
    return cls(**kwargs)



def _validate(config: Config) -> None:
    metrics = config.processors.llm_metrics
    seen: set[str] = set()
    for i, dim in enumerate(metrics.dimensions):
        path = f"processors.llm_metrics.dimensions[{i}]"
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", dim.name):
            raise ConfigError(f"{path}.name", f"must be a Prometheus label name, got {dim.name!r}")
        if dim.name in seen:
            raise ConfigError(f"{path}.name", f"duplicate dimension {dim.name!r}")
        seen.add(dim.name)
        if not dim.attribute:
            raise ConfigError(f"{path}.attribute", "required")
        if not dim.values:
            raise ConfigError(f"{path}.values", "required: the allow-list of label values (anything else becomes 'other')")
    for name in ("otlp", "otlphttp"):
        exporter = getattr(config.exporters, name)
        if exporter is None:
            continue
        path = f"exporters.{name}"
        if not exporter.endpoint:
            raise ConfigError(f"{path}.endpoint", "required (e.g. tempo:4317 for otlp, http://tempo:4318 for otlphttp)")
        if name == "otlphttp" and not exporter.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{path}.endpoint", f"expected an http:// or https:// URL, got {exporter.endpoint!r}")
        if name == "otlp":
            parse_endpoint(exporter.endpoint.split("://", 1)[-1], f"{path}.endpoint")
        if exporter.compression not in ("gzip", "none", ""):
            raise ConfigError(f"{path}.compression", f"expected gzip or none, got {exporter.compression!r}")
        retry = exporter.retry_on_failure
        if retry.multiplier < 1:
            raise ConfigError(f"{path}.retry_on_failure.multiplier", "must be >= 1")
        if retry.initial_interval > retry.max_interval:
            raise ConfigError(f"{path}.retry_on_failure.initial_interval", "must not exceed max_interval")
    sampling = config.processors.tail_sampling
    if sampling.grace > sampling.decision_wait:
        raise ConfigError("processors.tail_sampling.grace", "must not exceed decision_wait")
    pipeline = config.service.pipelines.traces
    if pipeline is not None:
        known = {
            "receivers": {f.name for f in dataclasses.fields(Receivers) if getattr(config.receivers, f.name) is not None},
            "processors": {f.name for f in dataclasses.fields(Processors)},
            "exporters": {f.name for f in dataclasses.fields(Exporters) if getattr(config.exporters, f.name) is not None},
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
        config = dataclasses.replace(config, receivers=Receivers(otlp=OtlpReceiver(protocols=protocols)))
    _validate(config)
    return config


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return config_from_dict({})
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{path} is not valid YAML: {exc}") from None
    return config_from_dict(data)
