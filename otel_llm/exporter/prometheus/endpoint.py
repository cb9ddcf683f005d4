"""Prometheus pull endpoint: ``/metrics`` (text 0.0.4, or OpenMetrics when the scraper asks for it
in ``Accept``), ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics

from otel_llm.exporter.prometheus import protobuf
from otel_llm.exporter.prometheus.config import PrometheusExporter
from otel_llm.internal.httpserver import BackgroundHTTPServer, ConnectionLimits, QuietHandler, refused_connections
from otel_llm.internal.security import TokenCheck
from otel_llm.exporter.store.sqlite import FUTURE_SKEW_NS, SORT_COLUMNS, StoreError, StoreReader

_TRACE_PATH = re.compile(r"^/api/traces/([0-9a-fA-F]{1,32})$")


def encode_metrics(registry: CollectorRegistry, accept: str, native_histograms: bool = False) -> tuple[bytes, str]:
    """The exposition the scraper asked for in ``Accept``: with ``native_histograms``, the protobuf
    MetricFamily format when the scraper prefers it (native histograms beside the classic buckets).

    prometheus_client 0.26 removes ``:`` from OpenMetrics *sample* names under ``underscores``
    escaping but keeps it in the family name, so Prometheus rejects every ``vllm:`` family. Every
    name we expose is already legacy-valid (dotted OTel names are translated when declared), and
    for legacy-valid names ``underscores`` escaping is the identity: render them unescaped.
    """
    if native_histograms and protobuf.asks_for_protobuf(accept):
        return protobuf.encode(registry.collect()), protobuf.CONTENT_TYPE
    encoder, content_type = choose_encoder(accept)
    if content_type.startswith("application/openmetrics-text"):
        # prometheus_client's openmetrics exposition has no annotations (generate_latest returns bytes).
        escaping = openmetrics.ALLOWUTF8
        body: bytes = openmetrics.generate_latest(registry, escaping=escaping)  # type: ignore[no-untyped-call]
        return body, content_type
    return encoder(registry), content_type


class _Handler(QuietHandler):
    registry: ClassVar[CollectorRegistry]
    ready: ClassVar[threading.Event]
    native_histograms: ClassVar[bool] = False
    store: ClassVar[StoreReader | None]
    not_ready: ClassVar[staticmethod[[], str | None] | None]  # a reason while a part cannot do its job
    token: ClassVar[TokenCheck]

    def send_body(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        # Every answer: never sniffed into another type, never cached (request data, live metrics);
        # the web view's own headers (a static file's max-age) take precedence.
        super().send_body(status, body, content_type,
                          {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store", **(headers or {})})

    def _json(self, status: int, payload: Any) -> None:
        self.send_body(status, json.dumps(payload).encode(), "application/json")

    def _api(self, path: str, query: dict[str, list[str]]) -> None:
        if self.store is None:
            self._json(404, {"error": "the trace store is disabled (exporters.store)"})
            return
        def arg(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None
        try:
            if path == "/api/traces":
                limit = int(arg("limit") or 50)
                since, until = arg("since"), arg("until")
                try:
                    since_ns, until_ns = (int(v) if v else None for v in (since, until))
                except ValueError:
                    self._json(400, {"error": "since and until are Unix times in nanoseconds (integers)"})
                    return
                if until_ns is None:  # a start time years ahead must not pin the list
                    until_ns = time.time_ns() + FUTURE_SKEW_NS
                rows = self.store.list_requests(
                    model=arg("model"), outcome=arg("outcome"), service=arg("service"), sort=arg("sort") or "start",
                    limit=limit, since_unix_ns=since_ns, until_unix_ns=until_ns)
                self._json(200, {"traces": rows})
                return
            match = _TRACE_PATH.match(path)
            if match is None:
                self._json(404, {"error": "try /api/traces or /api/traces/{trace_id}"})
                return
            try:
                span_offset = int(arg("span_offset") or 0)
            except ValueError:
                self._json(400, {"error": "span_offset is a number of spans (an integer)"})
                return
            trace = self.store.get_trace(match.group(1).rjust(32, "0"), span_offset=span_offset)
            if trace is None:
                self._json(404, {"error": f"trace {match.group(1)} is not in the store"})
            else:
                self._json(200, trace)
        except ValueError as exc:
            self._json(400, {"error": str(exc), "sort": sorted(SORT_COLUMNS)})
        except (FileNotFoundError, StoreError) as exc:
            self._json(503, {"error": str(exc)})

    def do_GET(self) -> None:
        self.body_read()  # no body: the read deadline ends here, a slow answer is not the client's time
        parsed = urllib.parse.urlsplit(self.path)
        path = parsed.path
        if path not in ("/healthz", "/readyz") and not self.token.allows(self.headers.get("Authorization")):
            self.send_body(401, b"missing or wrong bearer token\n", "text/plain", {"WWW-Authenticate": "Bearer"})
        elif path.startswith("/api/"):
            self._api(path, urllib.parse.parse_qs(parsed.query))
        elif path == "/metrics":
            body, content_type = encode_metrics(self.registry, self.headers.get("Accept") or "",
                                                self.native_histograms)
            self.send_body(200, body, content_type)
        elif path == "/healthz":
            self.send_body(200, b"ok\n", "text/plain")
        elif path == "/readyz":
            problem = self.not_ready() if self.not_ready is not None and self.ready.is_set() else None
            if problem is not None:
                self.send_body(503, f"not ready: {problem}\n".encode(), "text/plain", {"Retry-After": "5"})
            elif self.ready.is_set():
                self.send_body(200, b"ready\n", "text/plain")
            else:
                self.send_body(503, b"starting\n", "text/plain", {"Retry-After": "1"})
        else:
            self.send_body(404, b"not found; try /metrics, /healthz, /readyz, /api/traces\n", "text/plain")

    do_HEAD = do_GET

    def do_POST(self) -> None:  # read-only
        # The body is not read: the connection closes after the answer, so no byte of it is taken
        # for the next request.
        self.close_connection = True
        self.send_body(405, b"read-only; try GET\n", "text/plain", {"Allow": "GET, HEAD", "Connection": "close"})


class PrometheusEndpoint:
    def __init__(self, settings: PrometheusExporter, registry: CollectorRegistry, ready: threading.Event,
                 store: StoreReader | None = None, not_ready: Callable[[], str | None] | None = None) -> None:
        token = TokenCheck(settings.auth)
        handler = type("PrometheusHandler", (_Handler,), {"registry": registry, "ready": ready, "store": store,
                                                          "not_ready": staticmethod(not_ready) if not_ready else None,
                                                          "token": token,
                                                          "native_histograms": settings.native_histograms})
        limits = ConnectionLimits(max_connections=settings.max_connections,
                                  header_timeout_s=settings.read_header_timeout,
                                  request_timeout_s=settings.read_timeout, evict_idle=True,
                                  on_refused=refused_connections(registry, "prometheus"))
        self._server = BackgroundHTTPServer(settings.endpoint, handler, "prometheus", limits=limits)

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
