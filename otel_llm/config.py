"""The root of the configuration, in the shape of an OpenTelemetry Collector config.

Each component's options live in its own folder (``receiver/otlp/config.py``, ...) and are found
through its factory, so the ``receivers``, ``processors`` and ``exporters`` sections are built from
the component folders. What this module checks is what no single component can: the pipelines (which
components run, in which order), two components claiming one port or one directory, and the intake
log's place beside the store. A top-level section that is absent takes its defaults (without
``extensions``, the web view on loopback); a ``receivers``, ``exporters`` or ``extensions`` section
that is present sets up only the components it lists (a missing ``exporters.store`` means no store).
Every processor always has a config (its defaults); which processors run is
``service.pipelines.traces.processors`` (all four without pipelines). As in the Collector, a
component that no pipeline lists does not run, and ``service.extensions`` lists the extensions that
run (``[]``: none, the explicit way to turn the web view off).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from otel_llm.component import Kind, Signal, factories
from otel_llm.confmap import (
    MAX_DURATION_S,
    MAX_INT,
    ConfigError,
    Duration,
    Endpoint,
    PositiveInt,
    _Duration,
    format_duration,
    load_dataclass,
    parse_duration,
    parse_endpoint,
    split_endpoint,
)
from otel_llm.configtls import BearerAuth, ClientTls, ServerTls
from otel_llm.configtls import check_certificates as _check_certificate_files
from otel_llm.exporter.exporterhelper.config import RetryOnFailure, SendingQueue
from otel_llm.exporter.otlp.config import OtlpTraceExporter
from otel_llm.exporter.otlp_metrics.config import MetricsSendingQueue, OtlpMetricsExporter
from otel_llm.exporter.otlphttp.config import OtlpHttpTraceExporter
from otel_llm.exporter.prometheus.config import PrometheusExporter
from otel_llm.exporter.store.config import StoreExporter
from otel_llm.processor.llm_metrics.config import (
    DimensionConfig,
    EdgeTtftConfig,
    LlmMetricsProcessor,
    ModelNameConfig,
    Namings,
    ResourceModelRuleConfig,
)
from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor
from otel_llm.processor.redaction.config import DEFAULT_CONTENT_PATTERNS, DEFAULT_CONTENT_PREFIXES, RedactionProcessor
from otel_llm.processor.tail_sampling.config import (
    PolicyConfig,
    ProbabilisticPolicyConfig,
    RateLimitConfig,
    SloPolicyConfig,
    SlowestPolicyConfig,
    TailSamplingProcessor,
    default_policies,
)
from otel_llm.receiver.otlp.config import GrpcProtocol, HttpProtocol, IntakeLogConfig, OtlpProtocols, OtlpReceiver

__all__ = [
    "MAX_DURATION_S", "MAX_INT", "BearerAuth", "ClientTls", "Config", "ConfigError", "DEFAULT_CONTENT_PATTERNS",
    "DEFAULT_CONTENT_PREFIXES", "DimensionConfig", "Duration", "EdgeTtftConfig", "Endpoint", "GrpcProtocol",
    "HttpProtocol", "IntakeLogConfig", "LlmMetricsProcessor", "MemoryLimiterProcessor", "MetricsSendingQueue",
    "ModelNameConfig", "Namings", "OtlpHttpTraceExporter", "OtlpMetricsExporter", "OtlpProtocols", "OtlpReceiver",
    "OtlpTraceExporter", "PolicyConfig", "PositiveInt", "ProbabilisticPolicyConfig", "PrometheusExporter",
    "RateLimitConfig", "RedactionProcessor", "ResourceModelRuleConfig", "RetryOnFailure", "SendingQueue", "ServerTls",
    "SloPolicyConfig", "SlowestPolicyConfig", "StoreExporter", "TailSamplingProcessor", "check_certificates",
    "config_from_dict", "default_policies", "exposed_without_token", "format_duration", "intake_log_directory", "load_config", "parse_duration", "running_extensions",
    "parse_endpoint", "split_endpoint", "_Duration",
]

# The order components run in when ``service.pipelines.traces`` does not list them (the embedded
# defaults); anything else a new folder adds runs after these.
DEFAULT_PROCESSOR_ORDER = ("memory_limiter", "llm_metrics", "tail_sampling", "redaction")


def _section(kind: Kind) -> type:
    """The ``receivers`` / ``processors`` / ``exporters`` dataclass: one optional field per component folder."""
    fields: list[tuple[str, Any, Any]] = []
    for name, factory in factories(kind).items():
        default = field(default_factory=factory.config_class) if factory.in_defaults else None
        fields.append((name, factory.config_class | None, default))
    return dataclasses.make_dataclass(kind.value.capitalize(), fields, frozen=True)


# Typed Any for a type checker: the fields are the component folders found at import.
Receivers: Any = _section(Kind.RECEIVER)
Processors: Any = _section(Kind.PROCESSOR)
Exporters: Any = _section(Kind.EXPORTER)
Extensions: Any = _section(Kind.EXTENSION)


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
    # At a graceful stop, the pending traces are written beside the store for the next start instead
    # of decided (service/handover.py): behind the load balancer their late spans (an engine's, a
    # proxy's) reach the next process, and are measured with them. Off by default: a process stopped
    # for good (a laptop, a scale-down) should leave every trace decided and exported; the scale-out
    # configs (Helm with persistence, compose) turn it on.
    hand_over_pending_traces: bool = False
    # The extensions that run (the Collector's service.extensions); unset: every configured one; []: none.
    extensions: list[str] | None = None

    BOUNDS = {"shutdown_grace": (0.0, 3600.0)}


@dataclass(frozen=True)
class Config:
    # Sections built from the component folders (``_section``): a type checker sees Any.
    receivers: Receivers = field(default_factory=Receivers)
    processors: Processors = field(default_factory=Processors)
    exporters: Exporters = field(default_factory=Exporters)
    # Beside the pipelines (the web view): absent, the defaults (the web view); present, what it lists.
    extensions: Extensions = field(default_factory=Extensions)
    service: Service = field(default_factory=Service)

    def configured(self, kind: Kind) -> dict[str, Any]:
        """The components of ``kind`` the config sets up, by name (whether or not a pipeline runs them)."""
        section = getattr(self, kind.value)
        return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
                if getattr(section, f.name) is not None}

    def running(self, kind: Kind, signal: Signal = Signal.TRACES) -> list[str]:
        """The components of ``kind`` that run, in pipeline order: those a pipeline lists or, without
        pipelines, every configured one (processors in ``DEFAULT_PROCESSOR_ORDER``)."""
        known = factories(kind)
        configured = [n for n in self.configured(kind) if known[n].signal is signal]
        if kind is Kind.EXTENSION:
            return configured if self.service.extensions is None else list(self.service.extensions)
        pipelines = self.service.pipelines
        if signal is Signal.METRICS:
            if pipelines.metrics is not None:
                return list(pipelines.metrics.exporters)
            return [] if pipelines.traces is not None else configured
        if pipelines.traces is not None:
            return list(getattr(pipelines.traces, kind.value))
        if kind is Kind.PROCESSOR:
            rank = {name: i for i, name in enumerate(DEFAULT_PROCESSOR_ORDER)}
            return sorted(configured, key=lambda n: (rank.get(n, len(rank)), n))
        return configured

    def runs(self, kind: Kind, name: str) -> bool:
        return name in self.running(kind, factories(kind)[name].signal)


# --- checks across components ------------------------------------------------------------------


def config_warnings(config: Config) -> list[str]:
    """What the running components' settings likely lose (their ``warnings``): ``validate`` prints
    them and ``serve`` logs them; a config is never refused for them."""
    found: list[str] = []
    for kind in Kind:
        for name, settings in config.configured(kind).items():
            warnings = getattr(settings, "warnings", None)
            if warnings is not None and config.runs(kind, name):
                found.extend(warnings(f"{kind.value}.{name}"))
    return found


def _validate(config: Config) -> None:
    for kind in Kind:
        for name, settings in config.configured(kind).items():
            validate = getattr(settings, "validate", None)
            if validate is not None:
                validate(f"{kind.value}.{name}")
    _validate_pipelines(config)
    _validate_intake_log(config)
    _validate_handover(config)
    claimed: dict[str, str] = {}
    for path, endpoint in _listen_endpoints(config):
        if endpoint in claimed and not endpoint.endswith(":0"):
            raise ConfigError(path, f"{endpoint} is already used by {claimed[endpoint]}")
        claimed[endpoint] = path
    files: dict[Path, str] = {}
    for path, file in _files_claimed(config):
        resolved = Path(file).resolve()
        if resolved in files:
            raise ConfigError(path, f"{file} is already used by {files[resolved]}")
        files[resolved] = path


def _validate_pipelines(config: Config) -> None:
    pipelines = config.service.pipelines
    for kind in Kind:
        for name, factory in factories(kind).items():
            if factory.signal is Signal.METRICS and pipelines.traces is not None and name in pipelines.traces.exporters:
                i = pipelines.traces.exporters.index(name)
                raise ConfigError(f"service.pipelines.traces.exporters[{i}]",
                                  f"{name!r} is a metrics exporter: list it in service.pipelines.metrics.exporters")
    extensions = config.service.extensions
    if extensions is not None:
        configured_extensions = set(config.configured(Kind.EXTENSION))
        for i, name in enumerate(extensions):
            if name not in configured_extensions:
                raise ConfigError(f"service.extensions[{i}]", f"{name!r} is not configured under extensions "
                                                              f"(have: {', '.join(sorted(configured_extensions)) or 'none'})")
            if name in extensions[:i]:
                raise ConfigError(f"service.extensions[{i}]", f"{name!r} is listed twice")
    if pipelines.traces is not None:
        for kind in (Kind.RECEIVER, Kind.PROCESSOR, Kind.EXPORTER):
            configured = {n for n, f in factories(kind).items()
                          if f.signal is Signal.TRACES and n in config.configured(kind)}
            listed = getattr(pipelines.traces, kind.value)
            for i, name in enumerate(listed):
                if name not in configured:
                    raise ConfigError(f"service.pipelines.traces.{kind.value}[{i}]",
                                      f"{name!r} is not configured under {kind.value} "
                                      f"(have: {', '.join(sorted(configured)) or 'none'})")
                if name in listed[:i]:
                    raise ConfigError(f"service.pipelines.traces.{kind.value}[{i}]", f"{name!r} is listed twice")
    metrics_exporters = {n for n, f in factories(Kind.EXPORTER).items()
                         if f.signal is Signal.METRICS and n in config.configured(Kind.EXPORTER)}
    if pipelines.metrics is not None:
        for i, name in enumerate(pipelines.metrics.exporters):
            if name not in metrics_exporters:
                raise ConfigError(f"service.pipelines.metrics.exporters[{i}]",
                                  f"{name!r} is not a configured metrics exporter "
                                  f"(have: {', '.join(sorted(metrics_exporters)) or 'none'})")
    if pipelines.traces is not None or pipelines.metrics is not None:
        # With pipelines, only listed components run: a metrics exporter in none would be accepted and ignored.
        listed_metrics = set(pipelines.metrics.exporters) if pipelines.metrics is not None else set()
        for name in sorted(metrics_exporters - listed_metrics):
            raise ConfigError(f"exporters.{name}", "configured but in no pipeline, so it would not run: list it in "
                                                   "service.pipelines.metrics.exporters (or remove it)")
        if pipelines.metrics is not None and pipelines.metrics.exporters and "llm_metrics" not in \
                config.running(Kind.PROCESSOR):
            raise ConfigError("service.pipelines.metrics.exporters",
                              "the metrics come from processors.llm_metrics, which is not in service.pipelines.traces")
    if pipelines.traces is not None:
        _validate_processor_order(pipelines.traces.processors)


def _validate_processor_order(processors: list[str]) -> None:
    """A pipeline that cannot work is refused with the position that breaks it."""
    path = "service.pipelines.traces.processors"
    if "redaction" not in processors:
        raise ConfigError(path, "must list redaction: without it prompts and completions would leave otel-llm "
                                "(to keep content, list it and set processors.redaction.allow_content: true)")
    if "memory_limiter" in processors and processors[0] != "memory_limiter":
        i = processors.index("memory_limiter")
        raise ConfigError(f"{path}[{i}]", "memory_limiter must come first: it refuses data before anything holds it")
    if "tail_sampling" in processors:
        i = processors.index("tail_sampling")
        if "llm_metrics" not in processors[:i]:
            raise ConfigError(f"{path}[{i}]", "tail_sampling decides on the request records processors.llm_metrics "
                                              "builds: list llm_metrics before it")
    i = processors.index("redaction")
    for before in ("llm_metrics", "tail_sampling"):
        if before in processors[i:]:
            raise ConfigError(f"{path}[{i}]", f"redaction acts on the kept traces {before} hands on: list it after {before}")


def _listen_endpoints(config: Config) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind in Kind:
        for name, settings in config.configured(kind).items():
            if hasattr(settings, "listen_endpoints"):
                out += settings.listen_endpoints(f"{kind.value}.{name}")
    return out


def _files_claimed(config: Config) -> list[tuple[str, str]]:
    """Directories a component locks or owns when it starts: two components cannot share one."""
    out: list[tuple[str, str]] = []
    for kind in Kind:
        for name, settings in config.configured(kind).items():
            if hasattr(settings, "files_claimed"):
                out += settings.files_claimed(f"{kind.value}.{name}")
    if config.exporters.store is not None:
        out.append(("exporters.store.path", config.exporters.store.path))
    if intake_log_directory(config):
        out.append(("receivers.otlp.intake_log.directory", intake_log_directory(config)))
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: whatever it resolves to, it is a choice


def exposed_without_token(config: Config) -> list[str]:
    """The listeners of the running components that bind beyond loopback and take no bearer token,
    one sentence each: allowed (a private network may be the user's choice), logged once at start
    and shown on the Status page."""
    out: list[str] = []
    otlp = config.receivers.otlp
    if otlp is not None and config.runs(Kind.RECEIVER, "otlp"):
        for name in ("grpc", "http"):
            protocol = getattr(otlp.protocols, name)
            if protocol is not None and protocol.auth is None and not _is_loopback(split_endpoint(protocol.endpoint)[0]):
                out.append(f"receivers.otlp.protocols.{name}.endpoint {protocol.endpoint}: takes spans from any "
                           "host that reaches it, without a bearer token")
    prometheus = config.exporters.prometheus
    if prometheus is not None and config.runs(Kind.EXPORTER, "prometheus") and prometheus.auth is None \
            and not _is_loopback(split_endpoint(prometheus.endpoint)[0]):
        out.append(f"exporters.prometheus.endpoint {prometheus.endpoint}: /metrics and /api (request data) answer "
                   "any host that reaches them, without a bearer token")
    webview = config.extensions.webview
    if webview is not None and config.runs(Kind.EXTENSION, "webview") and webview.auth is None \
            and not _is_loopback(split_endpoint(webview.endpoint)[0]):
        out.append(f"extensions.webview.endpoint {webview.endpoint}: the web view (request data, the effective "
                   "config) answers any host that reaches it, without a bearer token")
    return out


def intake_log_directory(config: Config) -> str:
    """Where ``receivers.otlp.intake_log`` lives: its ``directory``, else beside the store."""
    otlp = config.receivers.otlp
    if otlp is None or otlp.intake_log is None:
        return ""
    if otlp.intake_log.directory:
        return str(otlp.intake_log.directory)
    store = config.exporters.store
    return str(Path(store.path) / "intake-log") if store is not None else ""


def _validate_intake_log(config: Config) -> None:
    otlp = config.receivers.otlp
    if otlp is not None and otlp.intake_log is not None and not intake_log_directory(config):
        raise ConfigError("receivers.otlp.intake_log.directory",
                          "required when there is no exporters.store (its default is beside the store)")


def _validate_handover(config: Config) -> None:
    if config.service.hand_over_pending_traces and not config.runs(Kind.EXPORTER, "store"):
        raise ConfigError("service.hand_over_pending_traces",
                          "needs exporters.store: the handover is written beside the store, for the next start on it")


def config_from_dict(data: Any) -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("", f"the config must be a mapping, got {type(data).__name__}")
    prometheus_raw = (data.get("exporters") or {}).get("prometheus") if isinstance(data.get("exporters"), dict) else None
    if isinstance(prometheus_raw, dict) and "web" in prometheus_raw:
        raise ConfigError("exporters.prometheus.web", "the web view is an extension now, on a listener of its own "
                                                      "(off the scrape path): move this block to extensions.webview "
                                                      "(endpoint: 127.0.0.1:9465 by default)")
    service_raw = data.get("service")
    if isinstance(service_raw, dict) and "adapter_process" in service_raw:
        raise ConfigError("service.adapter_process", "removed: with the compiled core the adapter stage is cheap, and "
                                                     "a third process cost a pipe round trip per request (2-3x the "
                                                     "CPU per span and a fifth to a half of the throughput, measured); "
                                                     "delete the key, and scale out behind the load balancer for "
                                                     "more throughput")
    listing = {"receivers": Receivers, "exporters": Exporters, "extensions": Extensions}
    config: Config = load_dataclass(Config, {k: v for k, v in data.items() if k not in listing}, "")
    for section, cls in listing.items():
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


def check_certificates(config: Config) -> None:
    """Every TLS file of every configured component loads as it will at start (see ``configtls``)."""
    places: list[tuple[str, str, str, str]] = []
    for kind in Kind:
        for name, settings in config.configured(kind).items():
            if hasattr(settings, "tls_places"):
                places += settings.tls_places(f"{kind.value}.{name}")
    _check_certificate_files(places)


def running_extensions(config: Config, ports: dict[str, int] | None = None) -> str:
    """The extensions that run and where they listen, for ``validate`` and the ready line
    (``webview 127.0.0.1:9465``; ``ports``: the ports they bound, for an endpoint's port 0), or
    ``none`` and how they were turned off."""
    names = config.running(Kind.EXTENSION)
    if not names:
        return "none (service.extensions: [])" if config.service.extensions is not None else "none"
    configured = config.configured(Kind.EXTENSION)
    described = []
    for name in names:
        endpoint = getattr(configured[name], "endpoint", "")
        if endpoint and ports and name in ports:
            endpoint = f"{split_endpoint(endpoint)[0]}:{ports[name]}"
        described.append(f"{name} {endpoint}".rstrip())
    return ", ".join(described)


def load_config(path: str | Path | None) -> Config:
    """``path``'s config; None: the embedded defaults (every section's, the web view included)."""
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
