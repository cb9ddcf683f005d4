"""Jaeger v1.76.0 (``github.com/jaegertracing/jaeger/cmd/jaeger``, Collector-based) for tests, built by
`make test` (``collector-config/peers.sh``). Every listener on 127.0.0.1 and a free port: the
defaults (cmd/jaeger/internal/all-in-one.yaml) bind 4317/4318/14250/14268/6831/6832/9411/5778/5779/
13133/16686/16685/8888 and more; this config enables only the OTLP receiver, the query API, the
health check and the internal metrics. Storage: ``memory`` (gone with the process) or ``badger`` in
the tmp dir (kept across a stop and a start, for outage tests).

    with JaegerProcess(tmp_path) as jaeger:
        point an OTLP exporter at jaeger.grpc_endpoint
        jaeger.trace(trace_id_hex)   # /api/traces/{id}: None until it is there
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.collector import PeerProcess, internal_telemetry
from tests.support.ports import free_port

JAEGER = "jaeger"


class JaegerProcess(PeerProcess):
    binary_name = JAEGER
    health_path = "/status"

    def __init__(self, tmp_dir: Path, *, storage: str = "memory", name: str = "jaeger") -> None:
        super().__init__(tmp_dir, name)
        if storage not in ("memory", "badger"):
            raise ValueError(storage)
        self.storage = storage
        self.grpc_port, self.http_port = free_port(), free_port()
        self.query_port, self.query_grpc_port, self.health_grpc_port = free_port(), free_port(), free_port()

    def _pick_ports(self) -> None:
        super()._pick_ports()
        self.grpc_port, self.http_port = free_port(), free_port()
        self.query_port, self.query_grpc_port, self.health_grpc_port = free_port(), free_port(), free_port()

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def config(self) -> dict[str, Any]:
        if self.storage == "memory":
            backend: dict[str, Any] = {"memory": {"max_traces": 100_000}}
        else:
            data = self.tmp_dir / f"{self.name}-badger"
            backend = {"badger": {"directories": {"keys": str(data / "keys"), "values": str(data / "values")},
                                  "ephemeral": False}}
        return {
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                         "exporters": ["jaeger_storage_exporter"]}},
                "telemetry": {**internal_telemetry(self.metrics_port), "resource": {"service.name": "jaeger"}},
            },
            "extensions": {
                "jaeger_query": {"storage": {"traces": "store"},
                                 "enable_tracing": False,  # on by default in v2: it would export its own spans
                                 "http": {"endpoint": f"127.0.0.1:{self.query_port}"},
                                 "grpc": {"endpoint": f"127.0.0.1:{self.query_grpc_port}"}},
                "jaeger_storage": {"backends": {"store": backend}},
                "healthcheckv2": {"use_v2": True,
                                  "http": {"endpoint": f"127.0.0.1:{self.health_port}"},
                                  "grpc": {"endpoint": f"127.0.0.1:{self.health_grpc_port}"}},
            },
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": self.grpc_endpoint},
                                                 "http": {"endpoint": f"127.0.0.1:{self.http_port}"}}}},
            "processors": {"batch": {"timeout": "100ms"}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "store"}},
        }

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.query_url + path, timeout=10) as response:
            return json.loads(response.read().decode())

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """``GET /api/traces/{id}`` (the query service's JSON API): the trace, or None if Jaeger has no such trace."""
        try:
            body = self._get(f"/api/traces/{trace_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        data = body.get("data") or []
        return data[0] if data else None

    def services(self) -> list[str]:
        return self._get("/api/services").get("data") or []
