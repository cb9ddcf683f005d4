"""``exporters.prometheus``: the pull endpoint (/metrics, /healthz, /readyz, /api)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration, Endpoint, PositiveInt
from otel_llm.configtls import BearerAuth, check_server_security


@dataclass(frozen=True)
class PrometheusExporter:
    endpoint: Endpoint = "127.0.0.1:9464"  # loopback unless set: 0.0.0.0:9464 to be scraped from elsewhere
    auth: BearerAuth | None = None  # required on /metrics and /api/*; /healthz and /readyz stay open
    # The listener's limits: open connections (a thread each; more are refused, counted), and the
    # deadlines a request's headers and whole request must meet from its first byte (cut, counted).
    max_connections: PositiveInt = 256
    read_header_timeout: Duration = 10.0
    read_timeout: Duration = 30.0
    # Serve Prometheus native histograms beside the classic buckets to a scrape that asks for the
    # protobuf exposition (Prometheus with --enable-feature=native-histograms); text is unchanged.
    native_histograms: bool = False
    # Buckets per sign of a native histogram at most (schema <= 8, downscaled to fit), as the
    # client_golang strategy's typical NativeHistogramMaxBucketNumber and OTel's MaxSize.
    native_histogram_max_buckets: int = 160

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_connections": (1, 100_000),  # a thread each
        "native_histogram_max_buckets": (2, 16384),
    }

    def validate(self, path: str) -> None:
        check_server_security(path, None, self.auth)
        for key in ("read_header_timeout", "read_timeout"):
            seconds = getattr(self, key)
            if not 0.001 <= seconds <= 86_400:  # 0 would cut every request, .inf is no deadline
                raise ConfigError(f"{path}.{key}", f"must be between 1ms and 24h, got {seconds!r}")
        if not self.native_histograms and self.native_histogram_max_buckets != 160:
            raise ConfigError(f"{path}.native_histogram_max_buckets", "applies only with native_histograms: true")
        if self.read_header_timeout > self.read_timeout:
            raise ConfigError(f"{path}.read_header_timeout", "must not exceed read_timeout")

    def listen_endpoints(self, path: str) -> list[tuple[str, str]]:
        return [(f"{path}.endpoint", self.endpoint)]
