"""``exporters.otlphttp``: kept traces over OTLP/HTTP (protobuf), the options of ``exporters.otlp``."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.confmap import ConfigError
from otel_llm.configtls import check_headers, check_url
from otel_llm.exporter.otlp.config import OtlpTraceExporter


@dataclass(frozen=True)
class OtlpHttpTraceExporter(OtlpTraceExporter):
    """``endpoint`` is a URL: ``/v1/traces`` is appended unless its path already ends with ``/v1/traces``."""

    def validate(self, path: str) -> None:
        if not self.endpoint:
            raise ConfigError(f"{path}.endpoint", "required (e.g. http://tempo:4318)")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{path}.endpoint", f"expected an http:// or https:// URL, got {self.endpoint!r}")
        check_url(self.endpoint, f"{path}.endpoint")
        check_headers(self.headers, f"{path}.headers", grpc=False)
        self.validate_common(path)
