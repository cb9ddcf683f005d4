"""``exporters.prometheus``: the pull endpoint (/metrics, /healthz, /readyz, /api)."""

from __future__ import annotations

from dataclasses import dataclass, field

from otel_llm.confmap import Endpoint
from otel_llm.configtls import BearerAuth, check_server_security
from otel_llm.webview.config import WebViewConfig


@dataclass(frozen=True)
class PrometheusExporter:
    endpoint: Endpoint = "0.0.0.0:9464"  # bind 127.0.0.1:9464 to keep /metrics and /api on loopback
    auth: BearerAuth | None = None  # required on /metrics and /api/*; /healthz and /readyz stay open
    web: WebViewConfig = field(default_factory=WebViewConfig)  # the web view at /: otel_llm/webview/README.md

    def validate(self, path: str) -> None:
        check_server_security(path, None, self.auth)
        self.web.validate(f"{path}.web")

    def listen_endpoints(self, path: str) -> list[tuple[str, str]]:
        return [(f"{path}.endpoint", self.endpoint)]
