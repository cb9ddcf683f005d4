"""Prometheus pull endpoint: ``/metrics`` (text 0.0.4, or OpenMetrics when the scraper asks for it
in ``Accept``), ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import threading
from typing import ClassVar

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics

from otel_llm.config import PrometheusExporter
from otel_llm.httpserver import BackgroundHTTPServer, QuietHandler


def encode_metrics(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The exposition the scraper asked for in ``Accept``.

    prometheus_client 0.26 removes ``:`` from OpenMetrics *sample* names under ``underscores``
    escaping but keeps it in the family name, so Prometheus rejects every ``vllm:`` family. Every
    name we expose is already legacy-valid (dotted OTel names are translated when declared), and
    for legacy-valid names ``underscores`` escaping is the identity: render them unescaped.
    """
    encoder, content_type = choose_encoder(accept)
    if content_type.startswith("application/openmetrics-text"):
        return openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8), content_type
    return encoder(registry), content_type


class _Handler(QuietHandler):
    registry: ClassVar[CollectorRegistry]
    ready: ClassVar[threading.Event]

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/metrics":
            body, content_type = encode_metrics(self.registry, self.headers.get("Accept") or "")
            self.send_body(200, body, content_type)
        elif path == "/healthz":
            self.send_body(200, b"ok\n", "text/plain")
        elif path == "/readyz":
            if self.ready.is_set():
                self.send_body(200, b"ready\n", "text/plain")
            else:
                self.send_body(503, b"starting\n", "text/plain", {"Retry-After": "1"})
        else:
            self.send_body(404, b"not found; try /metrics, /healthz, /readyz\n", "text/plain")

    do_HEAD = do_GET


class PrometheusEndpoint:
    def __init__(self, settings: PrometheusExporter, registry: CollectorRegistry, ready: threading.Event) -> None:
        handler = type("PrometheusHandler", (_Handler,), {"registry": registry, "ready": ready})
        self._server = BackgroundHTTPServer(settings.endpoint, handler, "prometheus")

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
