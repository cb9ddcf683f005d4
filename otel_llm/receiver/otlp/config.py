"""``receivers.otlp``: OTLP over gRPC and HTTP, with its limits, TLS, auth and the opt-in intake log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from otel_llm.confmap import MAX_INT, ConfigError, Duration, Endpoint, PositiveInt
from otel_llm.configtls import BearerAuth, ServerTls, check_server_security


@dataclass(frozen=True)
class GrpcProtocol:
    endpoint: Endpoint = "127.0.0.1:4317"  # loopback unless set: 0.0.0.0:4317 for every interface (containers)
    max_recv_msg_size_mib: PositiveInt = 4
    max_concurrent_streams: PositiveInt = 64
    workers: PositiveInt = 4  # unused since the receiver runs on grpc.aio (no thread pool); accepted for old configs
    # A call must deliver its whole request message within this; past it, it is cut (DEADLINE_EXCEEDED)
    # and counted (``read_timeout``): a call that sends only its headers holds nothing for long.
    read_timeout: Duration = 30.0
    tls: ServerTls | None = None
    auth: BearerAuth | None = None

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_recv_msg_size_mib": (1, 2047),  # bytes go into a C int grpc option
        "max_concurrent_streams": (1, 100_000),
        "workers": (1, 1024),
    }


@dataclass(frozen=True)
class HttpProtocol:
    endpoint: Endpoint = "127.0.0.1:4318"  # loopback unless set, as the Collector since v0.104
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

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_request_body_size": (1, MAX_INT),
        "max_concurrent_requests": (1, 100_000),
        "max_bytes_in_flight": (1024, MAX_INT),
        "max_connections": (1, 100_000),  # a thread each
    }


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
    # Free space the log always leaves on its filesystem (for its journal and checkpoint, which free
    # it, and for the store beside it); below it, requests are refused retryably (intake_log_full).
    min_free_mib: int = 64

    def validate(self, path: str) -> None:
        if self.fsync not in ("always", "interval", "never"):
            raise ConfigError(f"{path}.fsync", f"expected always, interval or never, got {self.fsync!r}")
        if not 0.001 <= self.fsync_interval <= 3600:
            raise ConfigError(f"{path}.fsync_interval", f"must be between 1ms and 1h, got {self.fsync_interval!r}")
        if self.max_size_mib > 1 << 30:
            raise ConfigError(f"{path}.max_size_mib", f"must be at most {1 << 30}, got {self.max_size_mib}")
        if isinstance(self.min_free_mib, bool) or not isinstance(self.min_free_mib, int) or \
                not 0 <= self.min_free_mib <= 1 << 30:
            raise ConfigError(f"{path}.min_free_mib", f"must be between 0 and {1 << 30}, got {self.min_free_mib!r}")
        if self.segment_size_mib * 2 > self.max_size_mib:
            raise ConfigError(f"{path}.segment_size_mib", "must be at most half of max_size_mib (segments are deleted whole)")


@dataclass(frozen=True)
class OtlpReceiver:
    protocols: OtlpProtocols = field(default_factory=OtlpProtocols)
    # Spans accepted but not yet processed; past it, exports are refused with a retry hint.
    max_queued_spans: PositiveInt = 200_000
    # A request that finds the intake full (queue_full, memory_limit) waits up to this for room before
    # it is refused: clients that never retry (the JS gRPC exporter) lose less. 0: refuse at once.
    admission_wait: Duration = 1.0
    intake_log: IntakeLogConfig | None = None  # off unless listed

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_queued_spans": (1, 100_000_000),  # a shared int64 beside byte counts
        "admission_wait": (0.0, 30.0),
    }

    def validate(self, path: str) -> None:
        for name in ("grpc", "http"):
            protocol = getattr(self.protocols, name)
            if protocol is not None:
                check_server_security(f"{path}.protocols.{name}", protocol.tls, protocol.auth)
        checks: list[tuple[str, float]] = []
        if self.protocols.grpc is not None:
            checks.append(("grpc.read_timeout", self.protocols.grpc.read_timeout))
        http = self.protocols.http
        if http is not None:
            checks += [("http.read_header_timeout", http.read_header_timeout), ("http.read_timeout", http.read_timeout),
                       ("http.idle_timeout", http.idle_timeout)]
        for key, seconds in checks:
            # 0 would cut every request, .inf would be no deadline at all: neither is a setting.
            if not 0.001 <= seconds <= 86_400:
                raise ConfigError(f"{path}.protocols.{key}", f"must be between 1ms and 24h, got {seconds!r}")
        if http is not None and http.read_header_timeout > http.read_timeout:
            raise ConfigError(f"{path}.protocols.http.read_header_timeout", "must not exceed read_timeout")
        if self.intake_log is not None:
            self.intake_log.validate(f"{path}.intake_log")

    def listen_endpoints(self, path: str) -> list[tuple[str, str]]:
        return [(f"{path}.protocols.{name}.endpoint", getattr(self.protocols, name).endpoint)
                for name in ("grpc", "http") if getattr(self.protocols, name) is not None]

    def tls_places(self, path: str) -> list[tuple[str, str, str, str]]:
        return [(f"{path}.protocols.{name}.tls", p.tls.cert_file, p.tls.key_file, p.tls.client_ca_file)
                for name in ("grpc", "http") if (p := getattr(self.protocols, name)) is not None and p.tls is not None]
