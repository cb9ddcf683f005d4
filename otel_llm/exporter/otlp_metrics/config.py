"""``exporters.otlp_metrics``: both namings pushed as OTLP metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration, PositiveInt
from otel_llm.configtls import ClientTls, check_client_tls, check_grpc_target, check_headers, check_url
from otel_llm.exporter.exporterhelper.config import RetryOnFailure


@dataclass(frozen=True)
class MetricsSendingQueue:
    # Snapshots waiting to be exported; a full queue drops its oldest (the next export carries its
    # data: totals when cumulative, the difference from the last success when delta).
    queue_size: PositiveInt = 10

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "queue_size": (1, 10_000),  # snapshots: every series of every family each
    }


@dataclass(frozen=True)
class ExponentialHistogramConfig:
    # The OTel SDK's Base2 Exponential Bucket Histogram Aggregation defaults (spec metrics/sdk.md):
    # at most max_size buckets per sign, starting at max_scale and downscaling as values spread.
    max_size: int = 160
    max_scale: int = 20

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_size": (2, 16384),  # opentelemetry-sdk's own bounds on max_size
        "max_scale": (-10, 20),  # the base-2 mappings' scales (ExponentMapping -10 .. LogarithmMapping 20)
    }


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
    # explicit: the buckets of /metrics; exponential: base-2 exponential histograms (OTLP
    # ExponentialHistogram), with the limits of ``exponential``, every histogram of the families.
    histogram: str = "explicit"
    exponential: ExponentialHistogramConfig = field(default_factory=ExponentialHistogramConfig)

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "timeout": (0.001, 3600.0),  # 0 would make the SDK fall back to its own default
        "interval": (0.1, 86400.0),  # a snapshot of every family each time
    }

    def validate(self, path: str) -> None:
        if self.protocol not in ("grpc", "http"):
            raise ConfigError(f"{path}.protocol", f"expected grpc or http, got {self.protocol!r}")
        if self.temporality not in ("cumulative", "delta"):
            raise ConfigError(f"{path}.temporality", f"expected cumulative or delta, got {self.temporality!r}")
        if self.histogram not in ("explicit", "exponential"):
            raise ConfigError(f"{path}.histogram", f"expected explicit or exponential, got {self.histogram!r}")
        if self.histogram != "exponential" and self.exponential != ExponentialHistogramConfig():
            raise ConfigError(f"{path}.exponential", "applies only with histogram: exponential")
        if self.compression not in ("gzip", "none", ""):
            raise ConfigError(f"{path}.compression", f"expected gzip or none, got {self.compression!r}")
        if self.endpoint:
            if self.protocol == "http":
                if not self.endpoint.startswith(("http://", "https://")):
                    raise ConfigError(f"{path}.endpoint", f"expected an http:// or https:// URL, got {self.endpoint!r}")
                check_url(self.endpoint, f"{path}.endpoint")
            else:
                check_grpc_target(self.endpoint, f"{path}.endpoint")
        check_headers(self.headers, f"{path}.headers", grpc=self.protocol == "grpc")
        check_client_tls(self.tls, f"{path}.tls")
        for key in self.resource_attributes:
            if not key:
                raise ConfigError(f"{path}.resource_attributes", "an attribute name must not be empty")
        self.retry_on_failure.validate(f"{path}.retry_on_failure")

    def tls_places(self, path: str) -> list[tuple[str, str, str, str]]:
        return [(f"{path}.tls", self.tls.cert_file, self.tls.key_file, self.tls.ca_file)]
