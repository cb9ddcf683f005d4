"""``exporters.otlp``: kept traces over OTLP/gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration
from otel_llm.configtls import ClientTls, check_client_tls, check_grpc_target, check_headers
from otel_llm.exporter.exporterhelper.config import RetryOnFailure, SendingQueue


@dataclass(frozen=True)
class OtlpTraceExporter:
    """Kept traces out over OTLP/gRPC (``exporters.otlp``); ``exporters.otlphttp`` has the same options."""

    endpoint: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout: Duration = 10.0
    compression: str = "gzip"
    tls: ClientTls = field(default_factory=ClientTls)
    retry_on_failure: RetryOnFailure = field(default_factory=RetryOnFailure)
    sending_queue: SendingQueue = field(default_factory=SendingQueue)

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "timeout": (0.0, 3600.0),
    }

    def validate(self, path: str) -> None:
        if not self.endpoint:
            raise ConfigError(f"{path}.endpoint", "required (e.g. tempo:4317)")
        check_grpc_target(self.endpoint, f"{path}.endpoint")
        check_headers(self.headers, f"{path}.headers", grpc=True)
        self.validate_common(path)

    def validate_common(self, path: str) -> None:
        check_client_tls(self.tls, f"{path}.tls")
        if self.compression not in ("gzip", "none", ""):
            raise ConfigError(f"{path}.compression", f"expected gzip or none, got {self.compression!r}")
        self.retry_on_failure.validate(f"{path}.retry_on_failure")

    def tls_places(self, path: str) -> list[tuple[str, str, str, str]]:
        return [(f"{path}.tls", self.tls.cert_file, self.tls.key_file, self.tls.ca_file)]

    def files_claimed(self, path: str) -> list[tuple[str, str]]:
        """Paths this exporter takes a lock on when it starts: two components cannot share one."""
        storage = self.sending_queue.storage
        return [(f"{path}.sending_queue.storage", storage)] if storage and self.sending_queue.enabled else []
